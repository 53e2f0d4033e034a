"""Forward multiply-adds per image with fvcore (the rows' `flops`), with a handle for every op it would otherwise drop.

Unit (fvcore's, which calls them "flops"): one count = one multiply-add of a matrix-like op (linear,
matmul, einsum, conv, SDPA, FFT, solve); normalisations as fvcore counts them; pure elementwise,
indexing and shape ops count 0 and are listed explicitly below, so `unsupported` only ever names an
op nobody has decided about. Device peaks count a multiply-add as 2 FLOPs, so FLOPs in that sense are
twice `count_flops` (benchmarks/throughput.py doubles it; the analysis labels the field "multiply-adds
per image, forward"). Every variant must come back with `unsupported == {}` (tested).
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import nn

with warnings.catch_warnings():  # fvcore's focal_loss calls the deprecated torch.jit.script at import
    warnings.simplefilter("ignore", FutureWarning)
    from fvcore.nn import FlopCountAnalysis
    from fvcore.nn.jit_handles import get_shape


def _sdpa_flop(inputs: list[Any], outputs: list[Any]) -> int:
    """q k^T and attn v: b h n m (d + e) multiply-adds (the mask add and softmax are elementwise)."""
    q, k, v = (get_shape(x) for x in inputs[:3])
    batch = math.prod(q[:-2])
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


def _ivalue(value: Any) -> Any:
    """A traced argument's constant: an int or None directly, a list (`s=(8, 16)`, `dim=(-2, -1)`) through the
    prim::ListConstruct node that builds it (whose own toIValue() is None: s and dim were read as absent)."""
    node = value.node()
    if node.kind() == "prim::ListConstruct":
        return [item.toIValue() for item in node.inputs()]
    return value.toIValue()


def _fft_flop(default_last: int, size_from_output: bool):
    """An FFT over n points costs n log2 n (radix-2 count), times the number of transforms.

    Signatures are aten::fft_*(self, n | s, dim, norm): the transform length is n / s when given
    (zero-padding or cropping), else the real side's size along dim (the output for c2r inverses).
    """

    def handle(inputs: list[Any], outputs: list[Any]) -> int:
        shape = get_shape(outputs[0] if size_from_output else inputs[0])
        out_shape = get_shape(outputs[0])
        size = _ivalue(inputs[1]) if len(inputs) > 1 else None
        dims = _ivalue(inputs[2]) if len(inputs) > 2 else None
        if dims is None:
            dims = list(range(len(shape) - default_last, len(shape)))
        dims = [d % len(shape) for d in ([dims] if isinstance(dims, int) else dims)]
        if size is None:
            lengths = [shape[d] for d in dims]
        else:
            lengths = [size] if isinstance(size, int) else list(size)
        n = math.prod(lengths)
        transforms = math.prod(out_shape[d] for d in range(len(out_shape)) if d not in dims)
        return int(transforms * n * math.log2(n)) if n > 1 else 0

    return handle


def _solve_flop(inputs: list[Any], outputs: list[Any]) -> int:
    """LU of an n x n system (n^3 / 3) plus forward/back substitution (n^2 per right-hand side)."""
    a, b = get_shape(inputs[0]), get_shape(inputs[1])
    n = a[-1]
    batch = math.prod(a[:-2])
    rhs = b[-1] if len(b) == len(a) else 1
    return batch * (n ** 3 // 3 + n * n * rhs)


def _cayley_sparse_solve_flop(inputs: list[Any], outputs: list[Any]) -> int:
    """rpevit.pe.sparse_solve CG: per step two products with S (2k entries per head, c columns),
    plus one for (I - S) z. Steps are data-dependent; counted at CG's finite-termination bound
    d/2 + 1, so this is an upper bound (benchmarks/cayley_solvers.py measures 1-11 steps at
    |S| ~ 1). Elementwise axpys count 0, as everywhere in this file."""
    heads, k = get_shape(inputs[0])
    d, c = get_shape(inputs[3])[-2:]
    steps = d // 2 + 1
    return (2 * steps + 1) * heads * 2 * k * c


def _triangular_solve_flop(inputs: list[Any], outputs: list[Any]) -> int:
    """Triangular solve A X = B, A (..., n, n): n^2 / 2 multiply-adds per right-hand-side column."""
    a, b = get_shape(inputs[0]), get_shape(inputs[1])
    return math.prod(b[:-2]) * (a[-1] ** 2 // 2) * b[-1]


HANDLES = {
    "aten::scaled_dot_product_attention": _sdpa_flop,
    "aten::fft_rfft2": _fft_flop(2, False),
    "aten::fft_irfft2": _fft_flop(2, True),
    "aten::fft_fft2": _fft_flop(2, False),
    "aten::fft_ifft2": _fft_flop(2, False),
    "aten::fft_rfft": _fft_flop(1, False),
    "aten::fft_irfft": _fft_flop(1, True),
    "aten::fft_fft": _fft_flop(1, False),
    "aten::fft_ifft": _fft_flop(1, False),
    "aten::linalg_solve": _solve_flop,
    "aten::linalg_solve_ex": _solve_flop,
    # ---- handles added for mechanisms' ops go here ----
    "aten::meshgrid": None,  # relative_offsets: index construction, 0 FLOPs
    "aten::pad": None,  # toeplitz_fft_matvec: zero-padding to the FFT grid, 0 FLOPs
    "prim::PythonOp._CayleySparseSolve": _cayley_sparse_solve_flop,  # sparse_cayley_string, solver sparse
    "aten::linalg_solve_triangular": _triangular_solve_flop,  # reflection_string's compact WY form
}

# Elementwise, reduction-free, indexing and shape ops: 0 FLOPs by fvcore's convention.
ZERO_COST_OPS = (
    "aten::add", "aten::add_", "aten::sub", "aten::rsub", "aten::mul", "aten::mul_", "aten::div",
    "aten::div_", "aten::neg", "aten::exp", "aten::log", "aten::sin", "aten::cos", "aten::pow",
    "aten::sqrt", "aten::rsqrt", "aten::reciprocal", "aten::abs", "aten::relu", "aten::relu_",
    "aten::gelu", "aten::softmax", "aten::sigmoid", "aten::tanh", "aten::softplus", "aten::clamp_min",
    "aten::mean", "aten::sum", "aten::amax", "aten::max", "aten::norm", "aten::linalg_vector_norm",
    "aten::square", "aten::where", "aten::lt", "aten::le", "aten::ne", "aten::fill_", "aten::zero_",
    "aten::unbind", "aten::stack", "aten::permute", "aten::transpose", "aten::reshape", "aten::view",
    "aten::unflatten", "aten::select", "aten::slice", "aten::squeeze", "aten::unsqueeze",
    "aten::repeat", "aten::expand_as", "aten::index_select", "aten::roll", "aten::flip",
    "aten::split", "aten::split_with_sizes", "aten::to", "aten::type_as", "aten::real",
    "aten::imag", "aten::view_as_real", "aten::view_as_complex", "aten::complex", "aten::polar",
    "aten::zeros_like", "aten::ones_like", "aten::zeros", "aten::ones", "aten::eye",
    "aten::new_zeros", "aten::new_ones", "aten::diag_embed", "aten::diagonal", "aten::triu",
    "aten::tril", "aten::clone", "aten::alias", "aten::numpy_T", "aten::t", "aten::mT",
    "aten::linspace", "aten::scatter", "aten::scatter_add", "aten::index_add", "aten::cumsum",
    "aten::masked_scatter", "aten::addcmul", "aten::lerp", "aten::sign", "aten::erf",
)


def count_flops(model: nn.Module, example_input: torch.Tensor) -> tuple[int, dict[str, int]]:
    """(forward multiply-adds per example, fvcore's "flops": 2 FLOPs each as device peaks count; ops fvcore
    could not count) for one batch of inputs."""
    if example_input.ndim == 0 or example_input.shape[0] == 0:  # per-example division below
        raise ValueError(f"count_flops: example_input has shape {tuple(example_input.shape)}; "
                         f"allowed: a batch of at least one example (e.g. the first test images)")
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            analysis = FlopCountAnalysis(model, example_input)
            analysis.set_op_handle(**HANDLES)
            analysis.set_op_handle(**{op: None for op in ZERO_COST_OPS})
            analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
            analysis.tracer_warnings("none")
            total = analysis.total()
            unsupported = dict(analysis.unsupported_ops())
    finally:
        model.train(was_training)
    # fvcore's einsum handle counts in floats (np.einsum_path): whole FLOPs, as every other handle returns
    return int(round(total)) // example_input.shape[0], unsupported
