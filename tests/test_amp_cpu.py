"""Every attention x position-encoding variant trains under `amp: bf16` on the CPU.

The GPU runs train under bf16 autocast; a mechanism whose FFT or linear solve is handed bf16
tensors fails there (cuFFT takes half precision for powers of two only, the triangular solve has
no bf16 kernel) or silently loses precision (an iterative solve whose products autocast rounds to
bf16). CPU autocast applies the same bf16 casts to the same ops (stricter: CPU FFTs refuse bf16
at every size), so these tests catch such a dtype bug in the regular suite, without a GPU
(tests/test_gpu.py repeats them on CUDA).

The variant list is read from the registries, so a newly registered attention or encoding is
trained here without editing this file.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from rpevit import registry
from rpevit.config import ConfigError, TrialConfig
from rpevit.models import build_model
from rpevit.tasks.steppers import make_optimizer
from rpevit.training import autocast_context

registry.load_all()

# digits-sized: 8x8 images, patch 2 -> a 4x4 grid of 16 tokens; head dim 8
TINY_MODEL = {"dataset": "digits", "patch_size": 2, "dim": 16, "heads": 2, "depth": 2, "mlp_ratio": 2.0,
              "num_features": 8, "drop_path": 0.0, "amp": "bf16", "device": "cpu"}

# options that switch a mechanism onto another numerical path (FFT vs dense, LU vs CG, ...)
PATH_OPTIONS: list[tuple[str, dict]] = [
    ("luo_rpe", {"luo_path": "fft"}),
    ("luo_rpe", {"luo_path": "dense"}),
    ("sparse_cayley_string", {"cayley_solver": "dense"}),
    ("sparse_cayley_string", {"cayley_solver": "sparse"}),
    ("rotinv", {"rotinv_mode": "random"}),
    ("rotinv", {"rotinv_basis": "bernstein"}),
    ("rotinv", {"rotinv_path": "dense"}),
]
COMBINATIONS = ["ape+rope", "ape+luo_rpe", "rope+luo_rpe", "ape+circulant_string", "cayley_string+rotinv"]


def variant_cases(model: dict | None = None) -> list[tuple[str, str, dict]]:
    """(attention, pe, extra options) for every registered attention x encoding, the path options,
    a few '+' combinations and qk_norm: l2; combinations the config rejects (for `model`, default
    TINY_MODEL) are left out."""
    model = TINY_MODEL if model is None else model
    pes = [(p, {}) for p in registry.POSITION_ENCODINGS]
    pes += [(p, opts) for p, opts in PATH_OPTIONS if p in registry.POSITION_ENCODINGS]
    pes += [(p, {}) for p in COMBINATIONS]
    cases = [(a, p, opts) for a, (p, opts) in itertools.product(sorted(registry.ATTENTIONS), pes)]
    cases += [(a, p, {"qk_norm": "l2"}) for a in sorted(registry.ATTENTIONS)
              for p in ("ape", "luo_rpe", "circulant_string", "cayley_string")]
    runnable = []
    for attention, pe, opts in cases:
        try:
            TrialConfig.from_dict({**model, "attention": attention, "pe": pe, **opts})
        except ConfigError:
            continue
        runnable.append((attention, pe, opts))
    return runnable


CASES = variant_cases()


def case_id(case: tuple[str, str, dict]) -> str:
    attention, pe, opts = case
    return "-".join([attention, pe, *(f"{k}={v}" for k, v in opts.items())])


def test_every_registered_variant_is_covered() -> None:
    """No single attention x encoding pair was silently dropped by config validation."""
    covered = {(a, p) for a, p, _ in CASES}
    for attention, pe in itertools.product(registry.ATTENTIONS, registry.POSITION_ENCODINGS):
        assert (attention, pe) in covered, f"{attention} x {pe} is not trained under bf16"
    assert any("+" in p for _, p, _ in CASES) and any(o.get("qk_norm") == "l2" for *_, o in CASES)


def bf16_train_steps(cfg: TrialConfig, steps: int = 2) -> list[float]:
    """`steps` optimiser steps as the train task takes them (autocast, float32 loss, clipping);
    asserts finite gradients on every parameter; returns the losses."""
    torch.manual_seed(0)
    device = torch.device(cfg.device)
    channels, size = cfg.spec.channels, cfg.resolved_image_size
    model = build_model(cfg, channels, 10).to(device)
    optimizer = make_optimizer(model, cfg)
    images = torch.randn(4, channels, size, size, device=device)
    labels = torch.arange(4, device=device) % 10
    model.train()
    losses = []
    for _ in range(steps):
        with autocast_context(cfg, device):
            logits = model(images)
            loss = F.cross_entropy(logits.float(), labels, label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        for name, p in model.named_parameters():
            if p.requires_grad:
                assert p.grad is not None and torch.isfinite(p.grad).all(), f"gradient of {name}"
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_variant_trains_two_bf16_steps_on_cpu(case: tuple[str, str, dict]) -> None:
    attention, pe, opts = case
    cfg = TrialConfig.from_dict({**TINY_MODEL, "attention": attention, "pe": pe, **opts})
    assert isinstance(autocast_context(cfg, torch.device("cpu")), torch.autocast)  # bf16 really on
    losses = bf16_train_steps(cfg)
    assert all(math.isfinite(x) for x in losses), losses


class _RecordDtypes(TorchFunctionMode):
    """Records the floating dtypes of tensors handed to FFT and linear-solve functions."""

    WATCHED = ("fft", "solve")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, torch.dtype]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if any(w in name for w in self.WATCHED):
            for a in itertools.chain(args, (kwargs or {}).values()):
                if isinstance(a, torch.Tensor) and (a.is_floating_point() or a.is_complex()):
                    self.seen.append((name, a.dtype))
        return func(*args, **(kwargs or {}))


HALF = (torch.bfloat16, torch.float16, torch.complex32)
# one case per FFT / dense-solve mechanism (the sparse CG is checked numerically below; the circulant
# STRING's real-DFT matmuls run in float32 under autocast: tests/test_pe_circulant.py)
FFT_AND_SOLVE_CASES = [
    ("favor", "luo_rpe", {"luo_path": "fft"}),
    ("relu", "luo_rpe", {"luo_path": "fft"}),
    ("favor", "cayley_string", {}),
    ("relu", "sparse_cayley_string", {"cayley_solver": "dense"}),
    ("softmax", "reflection_string", {}),
]


def fft_and_solve_dtypes(attention: str, pe: str, opts: dict, device: str) -> list[tuple[str, torch.dtype]]:
    """(function, dtype) of every floating tensor given to an FFT / solve in a bf16 forward +
    backward; asserts that at least one such call happened (else the check watches nothing)."""
    cfg = TrialConfig.from_dict({**TINY_MODEL, "attention": attention, "pe": pe, "device": device, **opts})
    model = build_model(cfg, 1, 10).to(device)
    images = torch.randn(2, 1, 8, 8, device=device)
    recorder = _RecordDtypes()
    with recorder, autocast_context(cfg, torch.device(device)):
        model(images).float().sum().backward()
    assert recorder.seen, f"no FFT or solve call seen for {pe} {opts}: the check watches nothing"
    return recorder.seen


@pytest.mark.parametrize("attention,pe,opts", FFT_AND_SOLVE_CASES)
def test_fft_and_solve_paths_run_in_float32_under_bf16_autocast(attention: str, pe: str, opts: dict) -> None:
    """Finite is not enough: a bf16 FFT / solve that happens to run loses ~3 significant digits."""
    seen = fft_and_solve_dtypes(attention, pe, opts, "cpu")
    assert not [s for s in seen if s[1] in HALF], seen


def sparse_cg_error_under_autocast(device: str) -> float:
    """Max error of the sparse-Cayley CG inverse run under bf16 autocast, against a float64 LU;
    also runs its backward inside autocast (as torch.autograd.grad in a loss closure would)."""
    from rpevit.pe.sparse_solve import cayley_solve_dense, cayley_solve_sparse

    d, heads, k = 32, 4, 50
    upper_rows, upper_cols = torch.triu_indices(d, d, offset=1)
    pick = torch.randperm(upper_rows.numel())[:k]
    rows, cols = upper_rows[pick][None].to(device), upper_cols[pick][None].to(device)
    values = torch.randn(heads, k, device=device, requires_grad=True)
    eye = torch.eye(d, device=device).expand(heads, -1, -1)
    exact = cayley_solve_dense(values.detach().double(), rows, cols, eye.double())
    with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
        x = cayley_solve_sparse(values, rows, cols, eye)
        x.sum().backward()
    assert x.dtype == torch.float32 and torch.isfinite(values.grad).all()
    return (x.double() - exact).abs().max().item()


@pytest.mark.filterwarnings("error:sparse Cayley CG stopped")
def test_sparse_cayley_cg_is_exact_to_float32_under_bf16_autocast() -> None:
    """The CG's S @ z products are matmuls, which autocast runs in bf16: without the solver's own
    float32 context its recursive residual still reports ~1e-7 while X is off by ~1e-2."""
    error = sparse_cg_error_under_autocast("cpu")
    assert error < 1e-5, error
