"""The pieces of one training step that the solo loop (tasks/train.py), the fused seed-group loop
(tasks/train_group.py) and the bench task share, so that every path computes the same step.

A step is: advance the random features (redraws where due), draw the stochastic-depth masks,
forward + loss (optionally compiled), backward, gradient clipping, AdamW, schedule. Everything
random is drawn outside the forward from a generator the caller owns, so the forward is a pure
function of (parameters, buffers, images, labels, masks): the form that `torch.compile(fullgraph=
True)` and `torch.func.vmap` (fused groups) need, and the reason a fused member or a compiled
step can reproduce the eager solo run (tests/test_fused_group.py, tests/test_compiled_step.py).
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Callable, Iterable, Iterator, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpevit.config import TrialConfig

DTYPES = {"float32": torch.float32, "float64": torch.float64}
COMPILE_MODES = {"on": None, "cudagraphs": "reduce-overhead", "graph": "reduce-overhead"}  # compile field -> mode
COMPILE_BACKEND = "inductor"  # torch.compile's backend; tests swap in aot_eager (no C++ build) and counters
CLIP_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_'s: coef = max_norm / (norm + 1e-6)


def autocast_context(cfg: TrialConfig, device: torch.device):
    """bf16 autocast where the config asks for it (`amp: bf16`, or `auto` on a GPU), else nothing."""
    return torch.autocast(device.type, dtype=torch.bfloat16) if uses_bf16(cfg, device) else nullcontext()


def uses_bf16(cfg: TrialConfig, device: torch.device) -> bool:
    return cfg.amp == "bf16" or (cfg.amp == "auto" and device.type == "cuda")


@contextmanager
def default_dtype(cfg: TrialConfig) -> Iterator[torch.dtype]:
    """The run's parameter and activation dtype (`dtype`) as torch's default for a block, restored
    after it: models built and images normalised inside are in that dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(DTYPES[cfg.dtype])
    try:
        yield DTYPES[cfg.dtype]
    finally:
        torch.set_default_dtype(previous)


def path_mask_dtype(cfg: TrialConfig, device: torch.device) -> torch.dtype:
    """The dtype of the residual branches where stochastic depth applies (bf16 under autocast:
    the branches end in a Linear), which timm's in-forward draw would give its mask."""
    return torch.bfloat16 if uses_bf16(cfg, device) else DTYPES[cfg.dtype]


def loss_of(logits: Tensor, labels: Tensor, label_smoothing: float) -> Tensor:
    """Label-smoothed cross-entropy, with bf16 logits upcast to float32 (float64 logits stay float64)."""
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    return F.cross_entropy(logits, labels, label_smoothing=label_smoothing)


def weighted_loss_of(logits: Tensor, labels: Tensor, label_smoothing: float, weights: Tensor) -> Tensor:
    """sum_i w_i loss_i, per-sample label-smoothed cross-entropy (bf16 logits upcast): with w_i = 1 / b it is
    loss_of's mean; a weight 0 leaves that image out (compile: graph pads an epoch's short last batch)."""
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    per_image = F.cross_entropy(logits, labels, label_smoothing=label_smoothing, reduction="none")
    return (per_image * weights.to(per_image.dtype)).sum()


LossFn = Callable[[nn.Module, Tensor, Tensor, Tensor], "tuple[Tensor, Tensor]"]
Result = TypeVar("Result")


class GuardedCompile:
    """A step's forward + loss, compiled as `cfg.compile` says, that falls back to eager honestly.

    Why: a compilation can fail on a device although it traced on the CPU (an Inductor or Triton
    bug, a kernel the device lacks). Losing a whole group to that wastes the GPU time it was given;
    running on eager without saying so would publish eager timings as compiled ones. So `step`
    runs the step's forward and backward with the compiled function, and if that raises, once:
    records why (`fallback`: the step, the exception's type and first two lines, which the row
    stores as `compile_fallback`), logs it, switches to the eager function for the rest of the run, and
    redoes that step eagerly. Nothing is lost: the forward is a pure function of its inputs, and
    the optimizer has not stepped yet. An error the eager step raises too is the run's error.
    """

    def __init__(self, fn: Callable, cfg: TrialConfig, log: Callable[[str], None] | None = None) -> None:
        if cfg.compile != "off":
            # A new run's step compiles from an empty Dynamo cache. A process runs run after run (Ray reuses
            # its workers; a benchmark, its modes): each run's step is a new closure of the same code, and
            # past Dynamo's per-code recompile limit (8) a fullgraph compile is a hard failure, so the ninth
            # trial of a worker ran eager (found by benchmarks/gpu_rehearsal.sh on torch 2.11).
            torch._dynamo.reset()
        self.eager = fn
        self.fn = compiled(fn, cfg)
        self.fallback = ""  # "" while compiled (or compile off); else why the run went eager
        self.steps = 0
        self.log = log or (lambda _msg: None)

    def __call__(self, *args: Tensor) -> "tuple[Tensor, Tensor]":
        return self.fn(*args)

    def step(self, forward_backward: Callable[[Callable], Result]) -> Result:
        """forward_backward(fn): forward + loss with fn, then backward; guarded as the class says."""
        self.steps += 1
        if self.fn is self.eager:
            return forward_backward(self.eager)
        try:
            return forward_backward(self.fn)
        except Exception as err:  # noqa: BLE001 - any failure of the compiled step: recorded, redone eagerly
            lines = [line.strip() for line in str(err).splitlines() if line.strip()]
            self.fallback = f"step {self.steps}: {type(err).__name__}: {' '.join(lines[:2])}"[:500]
            self.fn = self.eager
            self.log(f"compile failed at {self.fallback}; this run continues eager (its rows say so: "
                     f"compile_fallback)")
            return forward_backward(self.eager)


def forward_loss_fn(cfg: TrialConfig, device: torch.device, normalize: Callable[[Tensor], Tensor],
                    log: Callable[[str], None] | None = None) -> GuardedCompile:
    """(model, uint8 images, labels, path masks) -> (loss, logits): normalisation, forward and loss of
    one training step under the run's autocast, compiled (fullgraph) when `cfg.compile` asks, with
    the eager fallback of GuardedCompile."""

    def forward_loss(model: nn.Module, images: Tensor, labels: Tensor, path_masks: Tensor) -> tuple[Tensor, Tensor]:
        with autocast_context(cfg, device):
            logits = model(normalize(images), path_masks)
            return loss_of(logits, labels, cfg.label_smoothing), logits

    return GuardedCompile(forward_loss, cfg, log)


def compiled(fn: Callable, cfg: TrialConfig) -> Callable:
    """fn under torch.compile(fullgraph=True) as `cfg.compile` says (`off`: fn itself). fullgraph:
    a graph break would silently fall back to eager for part of the step; this way it is an error."""
    if cfg.compile == "off":
        return fn
    mode = COMPILE_MODES[cfg.compile] if COMPILE_BACKEND == "inductor" else None  # modes are inductor's
    return torch.compile(fn, fullgraph=True, dynamic=False, mode=mode, backend=COMPILE_BACKEND)


def make_adamw(named_parameters: Iterable[tuple[str, nn.Parameter]], exempt: set[str], cfg: TrialConfig,
               device: torch.device) -> torch.optim.AdamW:
    """AdamW; no weight decay on the names in `exempt` (the model's `no_weight_decay()`), decay on
    the rest. A compiled run on a GPU uses the fused AdamW kernel (one launch for every parameter)."""
    decay, no_decay = [], []
    for name, p in named_parameters:
        if p.requires_grad:
            (no_decay if name in exempt else decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = {"fused": True} if cfg.compile != "off" and device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=cfg.resolved_lr, betas=(0.9, 0.999), **fused)


@torch.no_grad()
def clip_grad_norm_per_member(params: Iterable[Tensor], max_norm: float) -> Tensor:
    """Gradient clipping of stacked parameters (leading dim = member), each member by its own global
    norm, exactly as clip_grad_norm_ clips a solo model: g_m *= min(1, max_norm / (|g_m| + 1e-6)).
    Returns the (members,) norms before clipping. Never a norm over all members together: one
    member's large gradient would shrink every other member's step.

    A constant number of launches whatever the number of parameter tensors T, as clip_grad_norm_'s
    own foreach path: one multi-tensor norm of every member's slice of every gradient (k T views,
    no copies), then one multi-tensor scale per member (k launches), instead of 2 T kernels.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(0)
    members = grads[0].shape[0]
    slices = [g[m] for m in range(members) for g in grads]  # member-major views
    per_slice = torch.stack(torch._foreach_norm(slices)).view(members, len(grads))
    norms = torch.linalg.vector_norm(per_slice, dim=1)  # (k,)
    coef = (max_norm / (norms + CLIP_EPS)).clamp(max=1.0)
    for m in range(members):
        torch._foreach_mul_([g[m] for g in grads], coef[m].to(grads[0].dtype))
    return norms
