"""The compiled training step (`compile: on`): every registered variant traces as ONE graph in train
mode (fullgraph, stochastic depth on, random features redrawn), computes what the eager step
computes, and a run with redraws and a changing learning rate compiles once per batch shape.

The CPU tests use the aot_eager backend (the same Dynamo graph capture and AOTAutograd as inductor,
without building C++ kernels), except one per attention the CPU ladder compiles, which builds Inductor's
C++ kernels and trains three steps against eager; tests/test_gpu.py runs inductor on CUDA.
"""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from rpevit import registry, training
from rpevit.attention.kernelized import advance_random_features
from rpevit.config import ConfigError, TrialConfig
from rpevit.models import build_model
from rpevit.models.stacked import StackedModels
from rpevit.tasks.train import train_and_evaluate
from rpevit.tasks.train_group import train_group
from rpevit.training import forward_loss_fn, loss_of
from tests.test_amp_cpu import TINY_MODEL, case_id, variant_cases

pytestmark = pytest.mark.slow  # torch.compile of every variant

registry.load_all()

MODEL = {**TINY_MODEL, "amp": "none", "drop_path": 0.2, "redraw_interval": 2, "compile": "on"}
CASES = variant_cases(MODEL)


@pytest.fixture
def counter(monkeypatch):
    """torch.compile's backend for the test: aot_eager, counting every compiled frame."""
    torch._dynamo.reset()
    backend = CompileCounterWithBackend("aot_eager")
    monkeypatch.setattr(training, "COMPILE_BACKEND", backend)
    yield backend
    torch._dynamo.reset()


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_every_variant_compiles_as_one_graph_and_equals_eager(case, counter):
    attention, pe, opts = case
    cfg = TrialConfig.from_dict({**MODEL, "attention": attention, "pe": pe, **opts})
    model = build_model(cfg, 1, 10).train()
    x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))
    masks = model.draw_path_masks(4, dtype=torch.float32, device="cpu")
    compiled = forward_loss_fn(cfg, torch.device("cpu"), identity)  # fullgraph: a graph break raises
    loss, logits = compiled(model, x, y, masks)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    eager_logits = model(x, masks)
    loss_of(eager_logits, y, cfg.label_smoothing).backward()
    torch.testing.assert_close(logits, eager_logits, rtol=1e-5, atol=1e-6)
    for name, p in model.named_parameters():
        if name in grads:
            torch.testing.assert_close(grads[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert counter.frame_count == 1


def test_every_attention_and_encoding_is_compiled():
    covered = {(a, p) for a, p, _ in CASES}
    for attention in registry.ATTENTIONS:
        for pe in registry.POSITION_ENCODINGS:
            assert (attention, pe) in covered, (attention, pe)


def test_the_sparse_cg_solve_is_refused_with_compile():
    with pytest.raises(ConfigError, match="'compile'"):
        TrialConfig.from_dict({**MODEL, "pe": "sparse_cayley_string", "cayley_solver": "sparse"})


RUN = {"dataset": "digits", "train_subset": 100, "batch_size": 32, "epochs": 3, "dim": 16, "heads": 2, "depth": 2,
       "num_features": 8, "attention": "favor", "pe": "rope", "redraw_interval": 3, "eval_draws": 2}


def test_a_run_with_redraws_and_a_changing_lr_compiles_once_per_batch_shape(counter):
    """4 steps per epoch (3 of 32 images, 1 of 4), 12 steps, redraws at steps 3, 6 and 9, a new lr
    every step: two shapes, so at most two compilations; the metrics equal the eager run's."""
    cfg = TrialConfig.from_dict({**RUN, "compile": "on"})
    compiled_row = train_and_evaluate(cfg, log=None)
    assert 1 <= counter.frame_count <= 2, counter.frame_count
    eager_row = train_and_evaluate(cfg.replace(compile="off"), log=None)
    for key in ("test_acc", "test_acc_draw_mean", "log_likelihood", "final_val_acc"):
        assert abs(compiled_row[key] - eager_row[key]) <= 1e-4 * max(1.0, abs(eager_row[key])), key


def test_a_fused_compiled_group_compiles_once_per_batch_shape(counter):
    cfgs = [TrialConfig.from_dict({**RUN, "compile": "on", "seed": s}) for s in (0, 1, 2)]
    rows = train_group(cfgs, log=None)
    assert all(isinstance(r, dict) for r in rows), rows
    assert 1 <= counter.frame_count <= 2, counter.frame_count
    eager = train_group([c.replace(compile="off") for c in cfgs], log=None)
    for a, b in zip(rows, eager):
        assert abs(a["log_likelihood"] - b["log_likelihood"]) <= 1e-4 * abs(b["log_likelihood"])


def test_the_vmapped_member_loss_compiles_as_one_graph(counter):
    cfg = TrialConfig.from_dict({**MODEL, "attention": "favor", "pe": "luo_rpe"})
    stack = StackedModels([build_model(cfg.replace(seed=s), 1, 10).train() for s in range(3)])
    forward = stack.member_forward()

    def member_loss(params, buffers, x, y, masks):
        logits = forward(params, buffers, x, masks)
        return loss_of(logits, y, 0.1), logits

    compiled = training.compiled(stack.vmapped(member_loss), cfg)
    x, y = torch.randn(3, 4, 1, 8, 8), torch.randint(0, 10, (3, 4))
    masks = torch.stack([m.draw_path_masks(4, dtype=torch.float32, device="cpu") for m in stack.members])
    losses, _ = compiled(stack.params, stack.buffers, x, y, masks)
    eager, _ = stack.vmapped(member_loss)(stack.params, stack.buffers, x, y, masks)
    torch.testing.assert_close(losses, eager)
    assert counter.frame_count == 1


def test_the_cli_flag_alone_turns_compile_on():
    from rpevit.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["--compile"]).compile == "on"
    assert parser.parse_args(["--compile", "cudagraphs"]).compile == "cudagraphs"
    assert parser.parse_args([]).compile is None  # the config's default: off
    assert TrialConfig().compile == "off"


# -- a compilation that fails on a device: the run goes on eager and its rows say so -------------

def failing_backend(gm, example_inputs):
    raise RuntimeError("forced compile failure (a stand-in for an Inductor/Triton error on a device)")


@pytest.fixture
def failing_compile(monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(training, "COMPILE_BACKEND", failing_backend)
    yield
    torch._dynamo.reset()


TIMING = ("train_s_per_epoch", "images_per_s", "infer_ms_per_sample", "peak_mem_mb", "started_at")


def assert_same_metrics(fallen: dict, eager: dict) -> None:
    for key, value in eager.items():
        if key in TIMING or key in ("compile", "compile_fallback"):
            continue
        assert fallen[key] == value or (value != value and fallen[key] != fallen[key]), key


def test_a_failing_compile_runs_eager_and_the_row_says_why(failing_compile):
    cfg = TrialConfig.from_dict({**RUN, "compile": "on", "epochs": 2})
    logs: list[str] = []
    row = train_and_evaluate(cfg, log=logs.append)
    assert row["compile_fallback"].startswith("step 1: BackendCompilerFailed"), row["compile_fallback"]
    assert "forced compile failure" in row["compile_fallback"]
    assert sum("compile failed at step 1" in line for line in logs) == 1  # said once, not per step
    eager = train_and_evaluate(cfg.replace(compile="off"), log=None)
    assert eager["compile_fallback"] == ""
    assert_same_metrics(row, eager)  # the failed attempt changed nothing: the step was redone eagerly


def test_a_failing_compile_in_a_fused_group_runs_eager_and_every_row_says_why(failing_compile):
    cfgs = [TrialConfig.from_dict({**RUN, "compile": "on", "seed": s}) for s in (0, 1, 2)]
    rows = train_group(cfgs, log=None)
    assert all(isinstance(r, dict) for r in rows), rows
    assert all(r["compile_fallback"].startswith("step 1: BackendCompilerFailed") for r in rows), rows
    eager = train_group([c.replace(compile="off") for c in cfgs], log=None)
    for a, b in zip(rows, eager):
        assert b["compile_fallback"] == ""
        assert_same_metrics(a, b)


def test_compile_fallback_is_a_declared_column():
    assert registry.METRICS["train"].other["compile_fallback"] is str


# -- autocast inside vmap inside torch.compile(fullgraph=True): what a GPU sweep of all12.yaml runs ---
BF16_CELLS = ["mnist-49tok-softmax+luo_rpe", "cifar10-64tok-softmax+circulant_string", "mnist-49tok-favor+rope",
              "cifar10-64tok-relu+luo_rpe"]


@pytest.mark.parametrize("cell", BF16_CELLS)
def test_fused_compiled_bf16_all12_cells_equal_their_eager_solo_runs(cell, counter):
    """bf16 autocast traced inside the vmapped, compiled step (every other compile test runs amp: none),
    on all12's own models at their token counts: the fused compiled group equals its eager solo runs up
    to bf16 rounding, and compiled without a fallback (tests/all12_cells.py; tests/test_gpu.py runs
    every cell with Inductor on CUDA)."""
    from tests.all12_cells import all12_cells, cell_id, check_cell

    cfg = next(c for c in all12_cells(depth=1, device="cpu", amp="bf16") if cell_id(c) == cell)
    result = check_cell(cfg, members=2, steps=2)
    assert not result["compile_fallback"] and counter.frame_count >= 1, result
    assert result["grad_error"] < result["tolerance"] and result["loss_error"] < result["tolerance"], result


def test_run_after_run_in_one_process_every_step_compiles(counter):
    """A Ray worker runs trial after trial (reused actors), each step a new closure of the same code;
    past Dynamo's recompile limit (8 per code object) a fullgraph compile failed and the run went eager
    (the rehearsal's ninth all12 cell did). Each run now compiles afresh: ten variants, ten compiles."""
    variants = [(a, p) for a in ("softmax", "favor", "relu") for p in ("ape", "rope", "luo_rpe", "circulant_string")]
    for attention, pe in variants[:10]:
        cfg = TrialConfig.from_dict({**MODEL, "attention": attention, "pe": pe})
        model = build_model(cfg, 1, 10).train()
        x, y = torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))
        masks = model.draw_path_masks(4, dtype=torch.float32, device="cpu")
        guard = forward_loss_fn(cfg, torch.device("cpu"), identity)
        guard.step(lambda fn: fn(model, x, y, masks)[0].backward())
        assert guard.fallback == "", (attention, pe, guard.fallback)
    assert counter.frame_count == 10


# -- Inductor's C++ kernels on the CPU: what search_spaces/cifar10_ladder_cpu.yaml runs for softmax and FAVOR+ ---
LADDER_COMPILED = [("softmax", "luo_rpe"), ("favor", "circulant_string")]


@pytest.mark.parametrize("attention,pe", LADDER_COMPILED, ids=[f"{a}+{p}" for a, p in LADDER_COMPILED])
def test_inductor_on_the_cpu_equals_eager(attention, pe):
    """The CPU ladder compiles with Inductor (every other CPU test here uses aot_eager, which builds no
    kernels): one variant per compiled attention, with drop path and redraws, three training steps
    (forward, backward, an SGD update) compiled and eager from the same start, equal up to float32 rounding.
    SGD, not AdamW: Adam divides each gradient by its own size, so a parameter whose true gradient is 0 (the
    key bias under softmax: it adds one constant to all of a query's logits) moves by ~lr on rounding noise
    alone, 1e-4 apart between two exact computations once digits' recipe gave Linear layers nonzero biases
    (torch_default init)."""
    torch._dynamo.reset()
    cfg = TrialConfig.from_dict({**MODEL, "attention": attention, "pe": pe, "dtype": "float32"})
    x, y = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(0)), torch.randint(0, 10, (4,))
    runs = []
    for backend in ("inductor", None):
        torch.manual_seed(0)
        model = build_model(cfg, 1, 10).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        forward = (forward_loss_fn(cfg, torch.device("cpu"), identity) if backend else
                   lambda m, a, b, k: (loss_of(m(a, k), b, cfg.label_smoothing), None))
        masks_rng = torch.Generator().manual_seed(1)
        for _ in range(3):  # redraw_interval 2: the third step runs on a new draw
            advance_random_features(model)
            masks = model.draw_path_masks(4, dtype=torch.float32, device="cpu", generator=masks_rng)
            optimizer.zero_grad()
            forward(model, x, y, masks)[0].backward()
            optimizer.step()
        if backend:
            assert forward.fallback == "", forward.fallback
        runs.append({n: p.detach().clone() for n, p in model.named_parameters()})
    torch._dynamo.reset()
    for name in runs[0]:
        torch.testing.assert_close(runs[0][name], runs[1][name], rtol=1e-4, atol=1e-5, msg=name)
