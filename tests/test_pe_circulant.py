"""circulant-STRING: the real-DFT rotation equals the complex FFT path it replaced and matrix_exp of the
dense generators (float64); group properties; no complex tensor anywhere in its forward or backward."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rpevit.config import ConfigError, TrialConfig
from rpevit.pe.circulant_string import (
    CirculantString, circulant_rotate, circulant_spectrum, rope_like_coefficients,
)


def complex_fft_spectrum(coefficients):
    """lambda = 2 Im rfft(c): the complex path before the real DFT (the reference)."""
    return 2 * torch.fft.rfft(coefficients, dim=-1).imag


def complex_fft_rotate(x, angles):
    """irfft(exp(i angles) rfft(x)), half precision in float32: the complex path before the real DFT."""
    work = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    phase = torch.polar(torch.ones_like(angles, dtype=work.dtype), angles.to(work.dtype))
    return torch.fft.irfft(torch.fft.rfft(work, dim=-1) * phase, n=x.shape[-1], dim=-1).to(x.dtype)


@pytest.mark.parametrize("d", [3, 4, 7, 8, 12, 16, 33, 64])
def test_real_dft_path_equals_the_complex_fft_path(d):
    """Every bin's angle random, the DC and Nyquist bins' too (irfft ignores their imaginary part)."""
    g = torch.Generator().manual_seed(d)
    coefficients = torch.randn(3, 2, d, generator=g, dtype=torch.float64)
    torch.testing.assert_close(circulant_spectrum(coefficients), complex_fft_spectrum(coefficients),
                               rtol=1e-12, atol=1e-12)
    x = torch.randn(2, 3, 5, d, generator=g, dtype=torch.float64)
    angles = 5 * torch.randn(3, 5, d // 2 + 1, generator=g, dtype=torch.float64)
    torch.testing.assert_close(circulant_rotate(x, angles), complex_fft_rotate(x, angles), rtol=1e-12, atol=1e-12)


def test_bf16_under_autocast_is_the_float32_rotation_rounded_once():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 16, generator=g).bfloat16()
    angles = 3 * torch.randn(2, 16, 9, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        rotated = circulant_rotate(x, angles)
    assert rotated.dtype == torch.bfloat16
    reference = complex_fft_rotate(x.float(), angles)
    torch.testing.assert_close(rotated.float(), reference, rtol=2 ** -8, atol=1e-6)  # one bf16 rounding


class _Dtypes(TorchDispatchMode):
    """Every dtype of every tensor an aten op returns."""

    def __init__(self):
        super().__init__()
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.seen.add((func.__name__, t.dtype))
        return out


def test_no_complex_tensor_in_forward_or_backward():
    """What the compiled, vmapped step traces holds no complex op (Inductor's CUDA path for them has
    open crashes and a silent wrong result): the encoding's rotate, with its gradient."""
    pe = CirculantString(grid=(4, 4), heads=2, head_dim=8, layer=0)
    q = torch.randn(3, 2, 16, 8, requires_grad=True)
    with _Dtypes() as mode:
        rq, rk = pe.rotate(q, q * 2)
        (rq.square().sum() + rk.sum()).backward()
    complex_ops = sorted({name for name, dtype in mode.seen if dtype.is_complex})
    assert not complex_ops, complex_ops
    assert pe.coefficients.grad is not None and pe.coefficients.grad.abs().sum() > 0


def circulant_matrix(c):
    """C[i, j] = c[(i - j) mod d]: C z is the circular convolution c * z."""
    d = c.shape[-1]
    idx = (torch.arange(d)[:, None] - torch.arange(d)[None, :]) % d
    return c[idx]


def dense_generator(coefficients, r):
    """sum_k r_k (C_k - C_k^T), a d x d skew-symmetric matrix."""
    total = 0
    for r_k, c_k in zip(r, coefficients):
        c = circulant_matrix(c_k)
        total = total + r_k * (c - c.T)
    return total


def fft_rotation_matrix(coefficients, r):
    """R(r) from the FFT path, applied to the identity's columns."""
    d = coefficients.shape[-1]
    angles = torch.as_tensor(r, dtype=torch.float64) @ circulant_spectrum(coefficients)  # d//2+1
    return circulant_rotate(torch.eye(d, dtype=torch.float64), angles.expand(d, -1)).T


@pytest.mark.parametrize("d", [4, 7, 8, 16])
def test_fft_rotation_equals_matrix_exp(d):
    g = torch.Generator().manual_seed(d)
    coefficients = torch.randn(2, d, generator=g, dtype=torch.float64)
    for r in ([1.0, 0.0], [0.0, 2.0], [3.0, -2.0], [0.5, 1.5]):
        dense = torch.linalg.matrix_exp(dense_generator(coefficients, r))
        z = torch.randn(5, d, generator=g, dtype=torch.float64)
        angles = (torch.tensor(r, dtype=torch.float64) @ circulant_spectrum(coefficients)).expand(5, -1)
        torch.testing.assert_close(circulant_rotate(z, angles), z @ dense.T)
        torch.testing.assert_close(fft_rotation_matrix(coefficients, r), dense)


@pytest.mark.parametrize("d", [7, 8])
def test_rotation_is_orthogonal_and_relative(d):
    coefficients = torch.randn(2, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    a, b = [2.0, -1.0], [-3.0, 4.0]
    ra, rb = fft_rotation_matrix(coefficients, a), fft_rotation_matrix(coefficients, b)
    torch.testing.assert_close(ra.T @ ra, torch.eye(d, dtype=torch.float64))
    diff = [y - x for x, y in zip(a, b)]
    torch.testing.assert_close(ra.T @ rb, fft_rotation_matrix(coefficients, diff))
    assert (ra - torch.eye(d, dtype=torch.float64)).abs().max() > 0.1  # a real rotation


def test_bins_zero_and_nyquist_never_rotate():
    d = 8
    coefficients = torch.randn(2, d, dtype=torch.float64)
    spectrum = circulant_spectrum(coefficients)
    assert spectrum[:, 0].abs().max() < 1e-12 and spectrum[:, d // 2].abs().max() < 1e-12
    rot = fft_rotation_matrix(coefficients, [2.0, 3.0])
    ones, alternating = torch.ones(d, dtype=torch.float64), (-1.0) ** torch.arange(d, dtype=torch.float64)
    torch.testing.assert_close(rot @ ones, ones)  # the DC direction is fixed
    torch.testing.assert_close(rot @ alternating, alternating)  # the Nyquist direction too


def test_rope_like_init_has_axial_rope_spectrum():
    d, base = 16, 100.0
    spectrum = circulant_spectrum(rope_like_coefficients(3, d, base).double())  # 3, 2, 9
    assert torch.equal(spectrum[0], spectrum[2])
    expected = torch.zeros(2, d // 2 + 1, dtype=torch.float64)
    for t in range(d // 2 - 1):
        expected[t % 2, t + 1] = base ** (-4.0 * (t // 2) / d)
    torch.testing.assert_close(spectrum[0], expected, atol=1e-6, rtol=1e-5)


def test_module_rotate_matches_dense_per_token_rotation():
    pe = CirculantString(grid=(4, 4), heads=2, head_dim=8, layer=0)
    with torch.no_grad():
        pe.coefficients.normal_(0, 0.3)
    q, k = torch.randn(2, 1, 2, 16, 8).unbind(0)
    rq, rk = pe.rotate(q, k)
    for h in range(2):
        for i, r in enumerate(pe.positions.tolist()):
            dense = torch.linalg.matrix_exp(dense_generator(pe.coefficients[h].detach().double(), r)).float()
            torch.testing.assert_close(rq[0, h, i], dense @ q[0, h, i], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(rk[0, h, i], dense @ k[0, h, i], atol=1e-5, rtol=1e-5)


def test_parameters_per_head_and_layer_and_half_precision():
    pe = CirculantString(grid=(4, 4), heads=2, head_dim=8, layer=3)
    assert pe.coefficients.shape == (2, 2, 8) and pe.coefficients.requires_grad
    with torch.no_grad():  # angles of a few radians, as after training, not only the RoPE-like start
        pe.coefficients.normal_(0, 0.3, generator=torch.Generator().manual_seed(3))
    q = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(4)).bfloat16()
    rq, _ = pe.rotate(q, q)
    assert rq.dtype == torch.bfloat16
    reference = pe.rotate(q.float(), q.float())[0]  # the same bf16 input rotated in float32
    torch.testing.assert_close(rq.float(), reference, rtol=2 ** -8, atol=1e-6)  # one bf16 rounding


def test_rejects_head_dim_below_three():
    with pytest.raises(ConfigError, match="'dim'.*circulant_string"):
        TrialConfig.from_dict(dict(image_size=8, patch_size=2, dim=4, heads=2, pe="circulant_string"))
