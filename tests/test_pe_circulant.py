"""circulant-STRING: the FFT rotation equals matrix_exp of the dense generators; group properties."""
import pytest
import torch

from rpevit.config import ConfigError, TrialConfig
from rpevit.pe.circulant_string import (
    CirculantString, circulant_rotate, circulant_spectrum, rope_like_coefficients,
)


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
    q = torch.randn(1, 2, 16, 8)
    rq, _ = pe.rotate(q.bfloat16(), q.bfloat16())
    assert rq.dtype == torch.bfloat16
    torch.testing.assert_close(rq.float(), pe.rotate(q, q)[0], atol=0.05, rtol=0.05)


def test_rejects_head_dim_below_three():
    with pytest.raises(ConfigError, match="'dim'.*circulant_string"):
        TrialConfig.from_dict(dict(image_size=8, patch_size=2, dim=4, heads=2, pe="circulant_string"))
