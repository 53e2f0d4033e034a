"""A fused seed group (rpevit/tasks/train_group.py) is its members' solo runs, computed together.

In float64 on the CPU:
- the step: for every registered attention x encoding (and the path options, '+' combinations and
  qk_norm of tests/test_amp_cpu.py), 20 steps of three stacked members (the real StackedStep:
  vmapped forward, summed backward, per-member clipping, one AdamW) leave every parameter and
  every AdamW moment within 1e-9 of three solo runs (the real solo_step), or, for an ill-conditioned
  cell, within ROUNDING_FACTOR x what one ulp of input rounding moves its solo runs (and never above
  ILL_CONDITIONED_CEILING), with stochastic depth,
  redraws every 3 steps (random-feature backends) and each member's own data;
- the task: train_group's rows equal train_and_evaluate's metric for metric (1e-9) for every
  attention and every encoding (each in at least one pairing), including the sparse CG solve that
  is stepped in turn, and its checkpoints are solo checkpoints;
- a diverging member fails alone; a group resumes from its members' checkpoints exactly; members
  at different epochs run as sub-groups; members draw distinct, reproducible masks.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from rpevit import checkpoint, registry
from rpevit.attention.kernelized import advance_random_features, set_training_length
from rpevit.config import ConfigError, TrialConfig
from rpevit.models import build_model
from rpevit.models.stacked import StackedModels, vmap_blockers
from rpevit.tasks.grouping import check_group
from rpevit.tasks.schedule import warmup_cosine
from rpevit.tasks.steppers import StackedStep, make_optimizer, solo_step
from rpevit.tasks.train import DivergedError, train_and_evaluate
from rpevit.tasks.train_group import train_group
from rpevit.training import forward_loss_fn
from tests.test_amp_cpu import TINY_MODEL, case_id, variant_cases

registry.load_all()

STEP_MODEL = {**TINY_MODEL, "amp": "none", "dtype": "float64", "drop_path": 0.2, "redraw_interval": 3,
              "batch_size": 8, "lr": 3e-3}
CASES = [c for c in variant_cases(STEP_MODEL)]
SEEDS = (0, 1, 2)
STEPS = 20
TIMING = ("train_s_per_epoch", "images_per_s", "infer_ms_per_sample", "peak_mem_mb", "fused_members")


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-300)
    return (a - b).abs().max().item() / scale


def normalize(x: torch.Tensor) -> torch.Tensor:
    return x


def member_batches(seed: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1000 + seed)  # each member its own data, as in a real group
    return [(torch.randn(8, 1, 8, 8, generator=g, dtype=torch.float64), torch.randint(0, 10, (8,), generator=g))
            for _ in range(steps)]


def build_members(cfg: TrialConfig) -> tuple[list[torch.nn.Module], list[torch.Generator]]:
    models, generators = [], []
    for seed in SEEDS:
        models.append(build_model(cfg.replace(seed=seed), 1, 10).double().train())
        generators.append(torch.Generator().set_state(torch.get_rng_state()))  # the solo run's global RNG
        set_training_length(models[-1], STEPS)
    return models, generators


# A cell whose fused run differs from its solo runs by 1e-9 or more (relative, float64) passes only if
# the solo runs themselves move that much under one ulp of rounding (every input x (1 + 2^-52)), within
# this factor: ill-conditioned cells (relu with l2-normalised q and k, where denominators come near 0;
# the Luo FFT path once 20 steps at a luo_scale of hundreds have spread the table over tens of logits, where its
# sums lose relative precision at the grid's edges: docs/mechanisms.md) amplify reordered sums as
# much as they amplify any rounding, while a fusion defect (a member's data, clipping, moments or draws
# crossed) is orders of magnitude above both.
ROUNDING_FACTOR = 100.0
# ...and never above this, however ill-conditioned: a cell whose one-ulp sensitivity is itself large
# (a diverging or chaotic run) would otherwise let any difference through. A fusion defect moves a member
# by O(1e-3) or more; on the 2-core Xeon (AVX-512) of 2026-11-29 every cell stays within 1.1e-10 of its
# solo runs (largest: sparse Cayley-STRING), so the branch above is for other BLAS builds.
ILL_CONDITIONED_CEILING = 1e-5


def solo_runs(cfg: TrialConfig, schedule, data, perturb: float = 0.0) -> list[torch.nn.Module]:
    """The members' solo runs (the real solo_step), inputs scaled by (1 + perturb); each model keeps
    its optimizer's state as .solo_state."""
    solo_models, solo_generators = build_members(cfg)
    forward_loss = forward_loss_fn(cfg, torch.device("cpu"), normalize)
    for model, generator, batches in zip(solo_models, solo_generators, data):
        optimizer = make_optimizer(model, cfg)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        for x, y in batches:
            advance_random_features(model)
            masks = model.draw_path_masks(len(x), dtype=torch.float64, device="cpu", generator=generator)
            solo_step(model, optimizer, scheduler, forward_loss, x * (1 + perturb), y, masks, cfg.grad_clip)
        model.solo_state = {"params": dict(model.named_parameters()), **optimizer.state_dict()}
    return solo_models


def trained_difference(solo_models: list[torch.nn.Module], others: list[dict]) -> tuple[float, tuple]:
    """The largest relative difference over every member's parameters and AdamW moments, and where."""
    worst = (0.0, ())
    for i, (solo, other) in enumerate(zip(solo_models, others)):
        for name, p in solo.solo_state["params"].items():
            worst = max(worst, (relative_error(p, other["params"][name]), (i, name)))
        for index, values in solo.solo_state["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                worst = max(worst, (relative_error(values[key], other["state"][index][key]), (i, index, key)))
    return worst


def rounding_sensitivity(cfg: TrialConfig, schedule, data, solo_models: list[torch.nn.Module],
                         rng_state: torch.Tensor, perturb: float = 2.0 ** -52) -> float:
    """How far the solo runs move when every input is perturbed by one ulp (float64), started from the
    global RNG state the solo runs started from."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.set_rng_state(rng_state)
        perturbed = solo_runs(cfg, schedule, data, perturb=perturb)
    finally:
        torch.set_default_dtype(previous)
    return trained_difference(solo_models, [m.solo_state for m in perturbed])[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_stacked_steps_equal_solo_steps(case):
    attention, pe, opts = case
    cfg = TrialConfig.from_dict({**STEP_MODEL, "attention": attention, "pe": pe, **opts})
    schedule = warmup_cosine(STEPS, 2)
    data = [member_batches(seed, STEPS) for seed in SEEDS]
    if vmap_blockers(build_model(cfg, 1, 10)):
        pytest.skip("stepped in turn (no vmap rule): test_group_rows_equal_solo_rows covers it")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        rng_state = torch.get_rng_state()
        solo_models = solo_runs(cfg, schedule, data)
        models, generators = build_members(cfg)
        step = StackedStep(models, cfg, torch.device("cpu"), normalize, schedule)
        for t in range(STEPS):
            for model in models:
                advance_random_features(model)
            masks = [m.draw_path_masks(8, dtype=torch.float64, device="cpu", generator=g)
                     for m, g in zip(models, generators)]
            step.step([d[t][0] for d in data], [d[t][1] for d in data], masks)
    finally:
        torch.set_default_dtype(previous)

    for i, (solo, member) in enumerate(zip(solo_models, models)):
        for name, b in solo.named_buffers():
            assert torch.equal(b, dict(member.named_buffers())[name]), (i, name)  # draws, counters
    fused_states = [{"params": dict(m.named_parameters()), **step.member_optimizer_state(i)}
                    for i, m in enumerate(models)]
    error = trained_difference(solo_models, fused_states)
    if error[0] >= 1e-9:  # an ill-conditioned cell: measure what one ulp of rounding does to it
        rounding = rounding_sensitivity(cfg, schedule, data, solo_models, rng_state)
        assert error[0] < min(ROUNDING_FACTOR * rounding, ILL_CONDITIONED_CEILING), \
            (error, f"one-ulp sensitivity {rounding:.2e}")
    # the members really are different models (not one model three times)
    assert relative_error(solo_models[0].head.weight, solo_models[1].head.weight) > 1e-3


def test_every_attention_and_encoding_is_in_the_step_test():
    covered = {(a, p) for a, p, _ in CASES}
    assert set(itertools.product(registry.ATTENTIONS, registry.POSITION_ENCODINGS)) <= covered


# ---------------------------------------------------------------- the task
TASK = {"dataset": "digits", "epochs": 2, "train_subset": 96, "batch_size": 16, "dim": 16, "heads": 2, "depth": 2,
        "num_features": 8, "redraw_interval": 3, "dtype": "float64", "eval_draws": 2, "drop_path": 0.2}


def task_cases() -> list[tuple[str, str, dict]]:
    """Every attention once with every encoding (encodings cycle over the attentions), plus the
    sparse CG solve, which a group steps in turn."""
    attentions, pes = sorted(registry.ATTENTIONS), sorted(registry.POSITION_ENCODINGS)
    cases = [(attentions[i % len(attentions)], pe, {}) for i, pe in enumerate(pes)]
    cases += [(a, "ape", {}) for a in attentions if a not in {c[0] for c in cases}]
    return cases + [("favor", "sparse_cayley_string", {"cayley_solver": "sparse"}),
                    ("favor", "rope", {"augment": "crop"}), ("softmax", "rotinv", {"augment": "rotate"})]


def assert_rows_equal(solo: dict, fused: dict) -> None:
    assert fused["fused_members"] == 3 and solo["fused_members"] == 1
    for key, value in solo.items():
        if key in TIMING:
            continue
        other = fused[key]
        if isinstance(value, float) and math.isfinite(value):
            assert abs(value - other) <= 1e-9 * max(abs(value), 1e-12), (key, value, other)
        elif isinstance(value, float):
            assert not math.isfinite(other), key
        elif isinstance(value, list) and value and isinstance(value[0], float):
            assert all(abs(a - b) <= 1e-9 * max(abs(a), 1e-12) for a, b in zip(value, other)), key
        else:
            assert value == other, key


@pytest.mark.slow
@pytest.mark.parametrize("case", task_cases(), ids=[case_id(c) for c in task_cases()])
def test_group_rows_equal_solo_rows(case, tmp_path):
    attention, pe, opts = case
    cfgs = [TrialConfig.from_dict({**TASK, "attention": attention, "pe": pe, **opts, "seed": s}) for s in SEEDS]
    solo = [train_and_evaluate(c, log=None, checkpoint_dir=tmp_path / f"solo{c.seed}") for c in cfgs]
    fused = train_group(cfgs, checkpoint_dirs=[tmp_path / f"fused{c.seed}" for c in cfgs], log=None)
    for a, b in zip(solo, fused):
        assert isinstance(b, dict), b
        assert_rows_equal(a, b)
    assert len({r["test_acc_draw_mean"] if attention != "softmax" else r["log_likelihood"] for r in fused}) > 1
    # a member's checkpoint has the solo layout and the solo values
    for seed in SEEDS:
        a = checkpoint.load(tmp_path / f"solo{seed}" / checkpoint.CHECKPOINT_NAME)
        b = checkpoint.load(tmp_path / f"fused{seed}" / checkpoint.CHECKPOINT_NAME)
        assert a.keys() == b.keys() and a["epoch"] == b["epoch"] == TASK["epochs"]
        for name, tensor in a["model"].items():
            assert relative_error(tensor.double(), b["model"][name].double()) < 1e-9 if tensor.is_floating_point() \
                else torch.equal(tensor, b["model"][name]), name
        assert torch.equal(a["rng"]["torch"], b["rng"]["torch"]) and torch.equal(a["rng"]["data"], b["rng"]["data"])
        assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"]
        assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]


@pytest.mark.slow
def test_one_diverging_member_does_not_touch_the_others(monkeypatch):
    """Member 1's weights are set to NaN before training: it fails at the end of the epoch, members 0
    and 2 finish with their solo rows."""
    base = {**TASK, "attention": "favor", "pe": "rope", "epochs": 1}
    cfgs = [TrialConfig.from_dict({**base, "seed": s}) for s in SEEDS]
    import rpevit.tasks.train as loop_module  # the one loop builds the members

    original = loop_module.build_model

    def poisoned(cfg, *args):
        model = original(cfg, *args)
        if cfg.seed == 1:
            with torch.no_grad():
                model.head.weight.fill_(float("nan"))
        return model

    monkeypatch.setattr(loop_module, "build_model", poisoned)
    outcomes = train_group(cfgs, log=None)
    assert isinstance(outcomes[1], DivergedError)
    for i in (0, 2):
        assert_rows_equal(train_and_evaluate(cfgs[i], log=None), outcomes[i])


class Killed(Exception):
    """Stands for the process being killed after an epoch's checkpoints were written."""


def train_group_killed_after_epoch_1(cfgs: list[TrialConfig], dirs: list) -> None:
    """train_group on `cfgs` with checkpoints in `dirs`, killed once every member has written epoch 1's
    checkpoint (the last member's epoch-1 row stands for the kill)."""
    def kill_after_first_epoch(i, row, folder):
        if i == len(cfgs) - 1 and row["epoch"] == 1:
            raise Killed

    with pytest.raises(Killed):
        train_group(cfgs, checkpoint_dirs=dirs, log=None, on_epoch=kill_after_first_epoch)


@pytest.mark.slow
def test_a_group_resumes_exactly_and_uneven_members_run_as_subgroups(tmp_path):
    base = {**TASK, "attention": "favor", "pe": "luo_rpe", "epochs": 2}
    cfgs = [TrialConfig.from_dict({**base, "seed": s}) for s in SEEDS]
    straight = train_group(cfgs, log=None)
    dirs = [tmp_path / str(s) for s in SEEDS]
    train_group_killed_after_epoch_1(cfgs, dirs)
    (dirs[2] / checkpoint.CHECKPOINT_NAME).unlink()  # seed 2 lost its checkpoint: it starts afresh, alone
    logs: list[str] = []
    resumed = train_group(cfgs, checkpoint_dirs=dirs, log=logs.append)
    assert any("resumed from the members' checkpoints after epoch 1" in line for line in logs)
    # two sub-groups, the earlier epoch first: seed 2 (a group of one) stepped alone, then seeds 0 and 1 stacked
    assert [line.split(":")[0] for line in logs if "stacked" in line or "stepped alone" in line] == [
        "fused group of 1 ([seed 2])", "fused group of 2 ([seed 0], [seed 1])"]
    for a, b in zip(straight, resumed):
        assert_rows_equal({**a, "fused_members": 1}, {**b, "fused_members": 3})


@pytest.mark.slow
def test_a_foreign_checkpoint_fails_its_member_only(tmp_path):
    base = {**TASK, "attention": "softmax", "pe": "rope", "epochs": 1}
    cfgs = [TrialConfig.from_dict({**base, "seed": s}) for s in SEEDS]
    dirs = [tmp_path / str(s) for s in SEEDS]
    train_and_evaluate(cfgs[0].replace(lr=5e-3), checkpoint_dir=dirs[1], log=None)  # another run's checkpoint
    outcomes = train_group(cfgs, checkpoint_dirs=dirs, log=None)
    assert isinstance(outcomes[1], checkpoint.CheckpointError) and "'lr'" in str(outcomes[1])
    assert isinstance(outcomes[0], dict) and isinstance(outcomes[2], dict)


def test_members_draw_distinct_reproducible_masks():
    cfg = TrialConfig.from_dict({**TASK, "attention": "softmax", "pe": "ape", "drop_path": 0.5, "depth": 3})
    masks = []
    for seed in SEEDS:
        model = build_model(cfg.replace(seed=seed), 1, 10)
        g = torch.Generator().set_state(torch.get_rng_state())
        masks.append(model.draw_path_masks(64, dtype=torch.float32, device="cpu", generator=g))
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    model = build_model(cfg.replace(seed=0), 1, 10)
    g = torch.Generator().set_state(torch.get_rng_state())
    assert torch.equal(masks[0], model.draw_path_masks(64, dtype=torch.float32, device="cpu", generator=g))
    assert torch.equal(masks[0][:2], torch.ones_like(masks[0][:2]))  # block 0 has rate 0: no draw, ones
    for site, rate in ((2, 0.25), (3, 0.25), (4, 0.5), (5, 0.5)):  # rates rise linearly to drop_path
        values = masks[0][site].unique()
        assert all(v == 0 or abs(v - 1 / (1 - rate)) < 1e-6 for v in values.tolist()), (site, values)


def test_mask_drawn_outside_equals_timm_draw_inside():
    """The eager forward without masks (timm's draw inside) equals the forward with the masks drawn
    beforehand from the same RNG state: the solo task's results did not change with this design."""
    cfg = TrialConfig.from_dict({**TASK, "attention": "softmax", "pe": "ape", "drop_path": 0.5, "dtype": "float32"})
    model = build_model(cfg, 1, 10).train()
    x = torch.randn(5, 1, 8, 8)
    state = torch.get_rng_state()
    inside = model(x)
    torch.set_rng_state(state)
    outside = model(x, model.draw_path_masks(5, dtype=torch.float32, device="cpu"))
    assert torch.equal(inside, outside)


def test_group_refuses_what_it_cannot_fuse():
    base = {**TASK, "attention": "softmax", "pe": "ape"}
    with pytest.raises(ConfigError, match="'lr'"):  # lr and the rest of the recipe agree inside a group
        check_group([TrialConfig.from_dict({**base, "seed": 0}), TrialConfig.from_dict({**base, "seed": 1, "lr": 1.0})])
    with pytest.raises(ConfigError, match="'dropout'"):
        check_group([TrialConfig.from_dict({**base, "dropout": 0.1, "seed": s}) for s in SEEDS])
    with pytest.raises(ConfigError, match="distinct seeds"):
        check_group([TrialConfig.from_dict(base)] * 2)


def test_stacked_optimizer_state_round_trips():
    cfg = TrialConfig.from_dict({**TASK, "attention": "favor", "pe": "rope", "dtype": "float32"})
    models = [build_model(cfg.replace(seed=s), 1, 10) for s in SEEDS]
    step = StackedStep(models, cfg, torch.device("cpu"), normalize, warmup_cosine(10, 1))
    x = [torch.randn(4, 1, 8, 8) for _ in SEEDS]
    y = [torch.randint(0, 10, (4,)) for _ in SEEDS]
    masks = [m.draw_path_masks(4, dtype=torch.float32, device="cpu") for m in models]
    step.step(x, y, masks)
    members = [step.member_optimizer_state(i) for i in range(len(SEEDS))]
    stacked = StackedModels.stack_optimizer_states(members)
    original = step.optimizer.state_dict()
    for index, values in original["state"].items():
        for key, value in values.items():
            assert torch.equal(value, stacked["state"][index][key]), (index, key)


def test_a_stacked_forward_runs_every_attention_batched_with_no_per_member_fallback():
    """Issue 43, item 9: SDPA's fused CPU kernel has no vmap batching rule, so vmap ran it member by member
    and warned "performance drop"; the stacked forward takes SDPA's math kernel and equals the solo
    forwards (float32, rounding)."""
    import warnings

    cfg = TrialConfig.from_dict({**TINY_MODEL, "attention": "softmax", "pe": "rope", "drop_path": 0.0})
    models = [build_model(cfg.replace(seed=seed), 1, 10).eval() for seed in SEEDS]
    stack = StackedModels(models)
    images = torch.randn(len(SEEDS), 4, 1, 8, 8)
    masks = torch.ones(len(SEEDS), 2 * cfg.depth, 4, 1, 1)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*performance drop.*")
        stacked = stack.vmapped(stack.member_forward())(stack.params, stack.buffers, images, masks)
    for i, model in enumerate(models):
        torch.testing.assert_close(stacked[i], model(images[i]), rtol=1e-5, atol=1e-6)
