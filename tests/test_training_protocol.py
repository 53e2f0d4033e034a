"""The training protocol's guards: qk L2 norm with a learned temperature, no weight decay on what
must not be decayed (registry-wide), redraws frozen after `redraw_until`, warm-up capped."""
import math

import pytest
import torch

from rpevit import registry
from rpevit.attention.base import softmax_attention_matrix, total_variation
from rpevit.attention.kernelized import KernelizedAttention, set_training_length
from rpevit.config import ConfigError, TrialConfig
from rpevit.models import build_attention, build_model
from rpevit.pe.base import PositionEncoding
from rpevit.tasks.schedule import WARMUP_MAX_FRACTION, warmup_steps_for
from rpevit.tasks.steppers import make_optimizer
from rpevit.tasks.train import one_draw_note

registry.load_all()


def cfg(**kw):
    base = dict(dataset="digits", patch_size=2, dim=32, heads=2, depth=2, num_features=16)
    return TrialConfig.from_dict({**base, **kw})


@pytest.mark.parametrize("attention", ["softmax", "favor", "relu"])
def test_qk_l2_gives_unit_q_and_k_before_the_temperature(attention):
    model = build_model(cfg(attention=attention, pe="rope", qk_norm="l2"), 1, 10)
    attn = model.attention_layers()[0]
    with torch.no_grad():
        attn.log_temperature.copy_(torch.tensor([0.3, -0.5]))
    q, k, _, _ = attn.attention_inputs(torch.randn(3, 16, 32))
    length = (attn.temperature * attn.head_dim ** 0.5).sqrt()[None, :, None]  # 1 h 1
    torch.testing.assert_close(q.norm(dim=-1) / length, torch.ones(3, 2, 16))
    torch.testing.assert_close(k.norm(dim=-1) / length, torch.ones(3, 2, 16))
    # so every backend's q^T k / sqrt(d) is tau_h cos(q, k)
    cos = torch.nn.functional.cosine_similarity(q[:, :, :, None], k[:, :, None], dim=-1)
    torch.testing.assert_close(q @ k.transpose(-1, -2) / attn.head_dim ** 0.5,
                               attn.temperature[None, :, None, None] * cos)


def test_no_qk_norm_has_no_temperature_and_leaves_q_k_alone():
    attn = build_model(cfg(pe="rope"), 1, 10).attention_layers()[0]
    assert attn.temperature is None and not hasattr(attn, "log_temperature")
    q, k = torch.randn(2, 2, 16, 16), torch.randn(2, 2, 16, 16)
    nq, nk = attn.normalize_qk(q, k)
    assert nq is q and nk is k


@pytest.mark.slow
def test_favor_error_is_bounded_with_unit_q_and_k():
    """With qk_norm l2 at its initial temperature 1, |q d^-1/4| = 1 whatever the weights, and the
    FAVOR+ rows stay close to softmax (measured mean TV 0.085 at m = 64, 64 tokens, head dim 16,
    over random directions; the bound below leaves room for draw-to-draw spread). Without the norm,
    the same directions at the lengths learned in practice (|q d^-1/4| ~ 3) are far off."""
    g = torch.Generator().manual_seed(0)
    directions = [torch.nn.functional.normalize(torch.randn(8, 2, 64, 16, generator=g), dim=-1) for _ in range(2)]
    tv = {}
    for label, length in (("unit", 1.0), ("learned", 3.0)):
        q, k = (d * length * 16 ** 0.25 for d in directions)
        values = []
        for seed in range(4):
            backend = build_attention(cfg(attention="favor", num_features=64, seed=seed), layer=0)
            values.append(total_variation(backend.attention_matrix(q, k), softmax_attention_matrix(q, k)).mean())
        tv[label] = torch.stack(values).mean().item()
    assert tv["unit"] < 0.12, tv
    assert tv["learned"] > 3 * tv["unit"], tv


@pytest.mark.parametrize("pe", sorted(registry.POSITION_ENCODINGS))
def test_no_weight_decay_on_encodings_norms_biases_and_temperatures(pe):
    """Registry-wide: a new encoding is covered without touching this test."""
    extra = {"string_sparsity": 0.5} if pe == "sparse_cayley_string" else {}
    model = build_model(cfg(attention="favor", pe=pe, qk_norm="l2", **extra), 1, 10)
    optimizer = make_optimizer(model, cfg(weight_decay=0.05))
    decayed = {id(p) for group in optimizer.param_groups if group["weight_decay"] > 0 for p in group["params"]}
    exempt = {id(p) for group in optimizer.param_groups if group["weight_decay"] == 0 for p in group["params"]}
    names = dict(model.named_parameters())
    assert decayed | exempt == {id(p) for p in names.values()} and not decayed & exempt
    must_be_exempt = {n for n, p in names.items() if p.ndim <= 1 or "log_temperature" in n}
    for prefix, module in model.named_modules():
        if isinstance(module, PositionEncoding):
            must_be_exempt |= {f"{prefix}.{n}" for n, _ in module.named_parameters()}
    for name in must_be_exempt:
        assert id(names[name]) in exempt, f"{name} is weight-decayed"
    for name, p in names.items():
        if name not in must_be_exempt:
            assert p.ndim >= 2 and id(p) in decayed, name  # weight matrices and the patch conv only
    assert any("log_temperature" in n for n in must_be_exempt)


def count_redraws(backend: KernelizedAttention, steps: int) -> int:
    draws = []
    original = backend.draw_projection
    backend.draw_projection = lambda draw, salt=0: draws.append(draw) or original(draw, salt)
    q = torch.randn(1, 2, 4, 16)
    backend.train()
    for _ in range(steps):
        backend.advance_step()
        backend(q, q, q)
    return len(draws)


@pytest.mark.slow
def test_redraw_until_freezes_the_draw():
    """Every 10 steps over 100 steps: redraws at steps 10..90 (9) for ever; with redraw_until 0.8
    only at 10..70 (7), the last 20% of training keep the draw the model is evaluated with."""
    forever = build_attention(cfg(attention="favor", redraw_interval=10), layer=0)
    assert count_redraws(forever, 100) == 9  # total_steps unknown: redraws never stop
    frozen = build_attention(cfg(attention="favor", redraw_interval=10, redraw_until=0.8), layer=0)
    model = torch.nn.ModuleList([frozen])
    set_training_length(model, 100)
    assert count_redraws(frozen, 100) == 7
    before = frozen.projection.clone()
    frozen.advance_step()
    frozen(torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16))
    assert torch.equal(frozen.projection, before)
    never = build_attention(cfg(attention="favor", redraw_interval=10, redraw_until=0.0), layer=0)
    set_training_length(torch.nn.ModuleList([never]), 100)
    assert count_redraws(never, 100) == 0


@pytest.mark.parametrize("attention,relu_projection,redraw,warned", [
    ("favor", "random", 0, True), ("relu", "random", 0, True), ("favor", "random", 100, False),
    ("relu", "identity", 0, False), ("softmax", "random", 0, False)])
def test_training_on_one_random_feature_draw_is_announced(attention, relu_projection, redraw, warned):
    config = cfg(attention=attention, pe="rope", relu_projection=relu_projection, redraw_interval=redraw)
    note = one_draw_note(build_model(config, 1, 10), config)
    assert (note is not None) == warned
    assert note is None or "test_acc_draw_mean" in note


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_redraw_until_outside_unit_interval_is_refused(value):
    with pytest.raises(ConfigError, match="redraw_until"):
        cfg(redraw_until=value)


@pytest.mark.parametrize("dataset,epochs", [("cifar10", 4), ("cifar10", 100), ("mnist", 2), ("digits", 30)])
def test_warmup_is_capped_to_a_fraction_of_the_run(dataset, epochs):
    config = TrialConfig.from_dict({"dataset": dataset, "epochs": epochs})
    steps_per_epoch = 100
    total = epochs * steps_per_epoch
    warmup = warmup_steps_for(config, steps_per_epoch, total)
    assert warmup <= math.ceil(WARMUP_MAX_FRACTION * total)
    assert warmup == min(round(config.resolved_warmup_epochs * steps_per_epoch), round(WARMUP_MAX_FRACTION * total))
    if dataset == "cifar10" and epochs == 4:
        assert warmup == 40  # 5 recipe epochs would never end in a 4-epoch run
