"""`compile: graph` (rpevit/tasks/whole_step.py): the whole training step in one function is today's
step, given the same draws.

In float64 on the CPU, for a fused group of two members with stochastic depth, crop + flip, gradient
clipping, weight decay on some parameters, a warm-up schedule and random features redrawn every 3
steps: several steps of WholeStep's one step function (eager, then compiled), full batches and the short
last batch of each epoch (padded to the batch size at weight 0, the same graph)
leave every loss, parameter, AdamW moment and step count equal (1e-10 relative) to the stacked step
of tasks/steppers.StackedStep (autograd, clip_grad_norm_per_member, torch.optim.AdamW, LambdaLR) fed
the same images, labels and masks, which are built from the same epoch draws by the per-step
functions of rpevit.data and ViT.draw_path_masks' arithmetic. Also: its epoch draws have the per-step
functions' distributions and are each member's own, a model it cannot step is refused in one line,
and the training task runs end to end with it and resumes from its checkpoint.
"""
from __future__ import annotations

import math

import pytest
import torch

from rpevit import registry
from rpevit.attention.kernelized import advance_random_features, set_training_length
from rpevit.config import TrialConfig
from rpevit.data import crop_flip, synthetic_splits
from rpevit.models import build_model
from rpevit.tasks import whole_step as ws_module
from rpevit.tasks.generators import member_random
from rpevit.tasks.schedule import lr_factor
from rpevit.tasks.steppers import StackedStep
from rpevit.tasks.whole_step import WholeStep, WholeStepError, augmented, draw_epoch
from rpevit.training import default_dtype
from tests.test_fused_group import train_group_killed_after_epoch_1

registry.load_all()

CFG = {"dataset": "digits", "patch_size": 2, "dim": 16, "heads": 2, "depth": 2, "mlp_ratio": 2.0, "num_features": 8,
       "amp": "none", "dtype": "float64", "device": "cpu", "drop_path": 0.2, "redraw_interval": 3,
       "batch_size": 8, "lr": 3e-3, "grad_clip": 0.5, "augment": "crop_flip", "epochs": 2, "warmup_epochs": 1.0}
N_TRAIN = 20  # 2 full batches of 8 and a short one of 4 per epoch
SEEDS = (0, 1)


def config(**changes) -> TrialConfig:
    return TrialConfig.from_dict({**CFG, **changes}).resolved()


def members(cfg: TrialConfig, total_steps: int) -> list[torch.nn.Module]:
    out = []
    for seed in SEEDS:
        model = build_model(cfg.replace(seed=seed), 1, 10).double().train()
        set_training_length(model, total_steps)
        out.append(model)
    return out


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = max(a.abs().max().item(), b.abs().max().item(), 1e-300)
    return (a.double() - b.double()).abs().max().item() / scale


def per_step_inputs(data, draws, positions, scales, padding):
    """What the per-step path feeds StackedStep for these epoch positions: rpevit.data's crop/flip of
    each member's images and ViT's mask arithmetic (Bernoulli draws x 1 / keep), from the same draws."""
    images, labels, masks = [], [], []
    for m in range(len(SEEDS)):
        idx = draws.order[m, positions]
        images.append(crop_flip(data.x_train[idx], draws.augment["oy"][m, positions], draws.augment["ox"][m, positions],
                                draws.augment["flip"][m, positions], padding))
        labels.append(data.y_train[idx])
        masks.append(draws.masks[m][:, positions][..., None, None] * scales)
    return images, labels, masks


def whole_step_against_stacked(device: torch.device, backend: str, tolerance: float = 1e-10, **changes) -> WholeStep:
    """Two epochs (full and short batches, redraws every 3 steps, the warm-up's lr) of WholeStep on `device`
    (backend 'eager': its functions uncompiled; else compiled as `compile: graph` compiles them, with that
    torch.compile backend) against StackedStep fed the same inputs; asserts equality within `tolerance`
    step by step (losses, parameters) and at the end (AdamW state, buffers, lr). Returns the WholeStep.
    Shared with tests/test_gpu.py, which runs it on CUDA under Inductor's CUDA graphs."""
    cfg = config(compile="graph", device=device.type, **changes)
    with default_dtype(cfg):
        data = synthetic_splits("digits", N_TRAIN, device)
        steps_per_epoch = math.ceil(N_TRAIN / cfg.batch_size)
        total = cfg.epochs * steps_per_epoch
        schedule = lr_factor(cfg, steps_per_epoch, total)
        ref_models = [m.to(device) for m in members(cfg, total)]
        graph_models = [m.to(device) for m in members(cfg, total)]
        reference = StackedStep(ref_models, config(device=device.type, **changes), device, data.normalize, schedule)
        whole = WholeStep(graph_models, cfg, device, data.normalize, schedule)
        if backend == "eager":  # the same functions, uncompiled
            whole.graph.fn = whole.one_step
        whole.prepare(data, total)
        reference.train(), whole.train()
        s = whole.state
        scales = graph_models[0]._path_scales(torch.float64, device)
        randoms = [member_random(seed, device, alone=False) for seed in SEEDS]
        for epoch in range(cfg.epochs):
            draws = draw_epoch(randoms, N_TRAIN, "crop_flip", data.spec.crop_padding, whole.keeps, torch.float64, device)
            s["order"].copy_(draws.order), s["masks"].copy_(draws.masks), s["i"].zero_()
            for name, table in draws.augment.items():
                s[f"aug_{name}"].copy_(table)
            for step in range(steps_per_epoch):
                lo = step * cfg.batch_size
                positions = torch.arange(lo, min(lo + cfg.batch_size, N_TRAIN), device=device)
                images, labels, masks = per_step_inputs(data, draws, positions, scales, data.spec.crop_padding)
                for model in ref_models:
                    advance_random_features(model)
                ref_losses, _ = reference.step(images, labels, masks)
                before = s["loss_sum"].clone()
                for model in graph_models:
                    ws_module.advance_redraws(model)
                whole.graph.step(lambda fn: fn(s))
                whole.scheduler_step()
                graph_losses = (s["loss_sum"] - before) / len(positions)
                assert relative_error(graph_losses, ref_losses) < tolerance, (epoch, step)
                for name, p in whole.stack.params.items():
                    assert relative_error(p, reference.stack.params[name]) < tolerance, (epoch, step, name)
        ref_state, graph_state = reference.optimizer.state_dict(), whole.optimizer.state_dict()
        for index, entry in ref_state["state"].items():
            assert float(graph_state["state"][index]["step"]) == float(entry["step"]) == total
            for key in ("exp_avg", "exp_avg_sq"):
                assert relative_error(graph_state["state"][index][key], entry[key]) < tolerance, (index, key)
        for name, buffer in reference.stack.buffers.items():  # the projections (redraws) and their step counts
            assert torch.equal(whole.stack.buffers[name], buffer), name
        assert whole.last_lr() == reference.last_lr()
        assert whole.graph.fallback == ""  # compiled, not quietly eager
    return whole


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_the_whole_step_equals_the_stacked_step_given_the_same_draws(backend, monkeypatch):
    import rpevit.training as training

    monkeypatch.setattr(training, "COMPILE_BACKEND", backend if backend != "eager" else "aot_eager")
    from torch._dynamo.utils import counters

    counters.clear()  # process-wide: in a whole test run, every earlier compiled test's graphs are counted too (CI: 97)
    whole_step_against_stacked(torch.device("cpu"), backend)
    if backend != "eager":  # full and short batches, two epochs: one graph, never recompiled (issue 60, item 7)
        assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_epoch_draws_are_each_members_own_and_distributed_as_the_per_step_draws():
    randoms = [member_random(seed, torch.device("cpu"), alone=False) for seed in (3, 4)]
    draws = draw_epoch(randoms, 4000, "crop_flip", 4, [1.0, 0.75], torch.float32, torch.device("cpu"))
    assert draws.order.shape == (2, 4000) and not torch.equal(draws.order[0], draws.order[1])
    assert all(torch.equal(row.sort().values, torch.arange(4000)) for row in draws.order)  # permutations
    assert draws.augment["oy"].min() == 0 and draws.augment["oy"].max() == 8  # randint(0, 2 * 4 + 1)
    assert abs(draws.augment["flip"].float().mean().item() - 0.5) < 0.03
    assert torch.all(draws.masks[:, 0] == 1)  # keep 1 draws nothing but ones
    assert abs(draws.masks[:, 1].mean().item() - 0.75) < 0.03
    again = draw_epoch([member_random(seed, torch.device("cpu"), alone=False) for seed in (3, 4)], 4000, "crop_flip", 4,
                       [1.0, 0.75], torch.float32, torch.device("cpu"))
    assert torch.equal(again.order, draws.order) and torch.equal(again.masks, draws.masks)  # reproducible


def test_augmented_is_the_per_image_crop_of_each_member():
    x = torch.randint(0, 255, (2, 3, 1, 8, 8), dtype=torch.uint8)
    draws = {"oy": torch.tensor([[0, 4, 8], [1, 2, 3]]), "ox": torch.tensor([[8, 4, 0], [3, 2, 1]]),
             "flip": torch.tensor([[True, False, True], [False, False, True]])}
    out = augmented(x, draws, "crop_flip", 4)
    for m in range(2):
        for j in range(3):
            one = crop_flip(x[m, j:j + 1], draws["oy"][m, j:j + 1], draws["ox"][m, j:j + 1], draws["flip"][m, j:j + 1], 4)
            assert torch.equal(out[m, j], one[0])
    assert torch.equal(augmented(x, {}, "none", 4), x)


def test_a_model_that_cannot_run_under_vmap_is_refused_in_one_line(monkeypatch):
    from rpevit.config import ConfigError

    with pytest.raises(ConfigError, match="field 'compile' has value 'graph' with cayley_solver 'sparse'"):
        config(compile="graph", pe="sparse_cayley_string", cayley_solver="sparse")  # the config refuses it first
    cfg = config(compile="graph")
    monkeypatch.setattr(ws_module, "vmap_blockers", lambda _model: ["a data-dependent solve"])  # a future blocker
    with default_dtype(cfg):
        data = synthetic_splits("digits", N_TRAIN, "cpu")
        with pytest.raises(WholeStepError, match="field 'compile' has value 'graph' but this model cannot run under "
                                                 "vmap \\(a data-dependent solve\\); allowed here: off, on, cudagraphs"):
            WholeStep(members(cfg, 4), cfg, torch.device("cpu"), data.normalize, lambda _t: 1.0)


@pytest.mark.slow
def test_the_train_task_runs_a_group_with_the_whole_step_and_resumes_it_exactly(tmp_path, monkeypatch):
    """Through train_group (the sweep's path for a fused group): the rows are complete and compiled (no
    fallback), and a group killed after epoch 1 resumes from its members' checkpoints to the same rows."""
    import rpevit.training as training
    from rpevit.tasks.train_group import train_group

    monkeypatch.setattr(training, "COMPILE_BACKEND", "aot_eager")  # Inductor's C++ build is the GPU lease's
    base = {"dataset": "digits", "epochs": 2, "train_subset": 96, "batch_size": 16, "dim": 16, "heads": 2, "depth": 2,
            "num_features": 8, "redraw_interval": 3, "dtype": "float64", "eval_draws": 2, "drop_path": 0.2,
            "attention": "favor", "pe": "rope", "compile": "graph", "augment": "crop_flip"}
    cfgs = [TrialConfig.from_dict({**base, "seed": s}) for s in SEEDS]
    straight = train_group(cfgs, log=None)
    assert all(isinstance(r, dict) and r["compile_fallback"] == "" and r["epochs_done"] == 2 for r in straight), straight
    assert straight[0]["test_acc"] != straight[1]["test_acc"] or straight[0]["train_s_per_epoch"] > 0
    dirs = [tmp_path / str(s) for s in SEEDS]
    train_group_killed_after_epoch_1(cfgs, dirs)
    resumed = train_group(cfgs, checkpoint_dirs=dirs, log=None)
    for a, b in zip(straight, resumed):
        for key in ("test_acc", "test_acc_draw_mean", "log_likelihood", "final_val_acc"):
            assert a[key] == pytest.approx(b[key], rel=1e-12, abs=1e-12), key
