"""2-D FFT block-Toeplitz sums against the explicit N x N weighted sum."""
import pytest
import torch

from rpevit.attention.toeplitz import fast_fft_size, toeplitz_dense_matrix, toeplitz_fft_matvec


def brute_force_toeplitz(weights, x, grid):
    """Y_i = sum_j c[y_j - y_i + H-1, x_j - x_i + W-1] X_j with explicit loops over token pairs."""
    h, w = grid
    coords = [(i // w, i % w) for i in range(h * w)]
    out = torch.zeros_like(x)
    for i, (yi, xi) in enumerate(coords):
        for j, (yj, xj) in enumerate(coords):
            c = weights[:, yj - yi + h - 1, xj - xi + w - 1]  # heads
            out[:, :, i] += c[None, :, None] * x[:, :, j]
    return out


GRIDS = [(1, 1), (1, 4), (2, 3), (3, 5), (4, 4), (5, 2), (6, 7)]


@pytest.mark.parametrize("grid", GRIDS)
def test_fft_matvec_equals_explicit_sum(grid):
    g = torch.Generator().manual_seed(sum(grid))
    h, w = grid
    weights = torch.exp(torch.randn(3, 2 * h - 1, 2 * w - 1, generator=g, dtype=torch.float64))
    x = torch.randn(2, 3, h * w, 5, generator=g, dtype=torch.float64)
    expected = brute_force_toeplitz(weights, x, grid)
    torch.testing.assert_close(toeplitz_fft_matvec(weights, x, grid), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("grid", GRIDS)
def test_dense_matrix_equals_definition(grid):
    g = torch.Generator().manual_seed(7)
    h, w = grid
    weights = torch.randn(2, 2 * h - 1, 2 * w - 1, generator=g, dtype=torch.float64)
    x = torch.randn(1, 2, h * w, 3, generator=g, dtype=torch.float64)
    dense = toeplitz_dense_matrix(weights, grid)  # h, N, N
    torch.testing.assert_close(torch.einsum("hij,bhjf->bhif", dense, x), brute_force_toeplitz(weights, x, grid))


@pytest.mark.slow
def test_fft_matvec_float32_and_gradient():
    grid = (3, 5)
    g = torch.Generator().manual_seed(0)
    table = torch.randn(2, 5, 9, generator=g, dtype=torch.float64, requires_grad=True)
    x = torch.randn(1, 2, 15, 4, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t, v: toeplitz_fft_matvec(torch.exp(t), v, grid), (table, x))
    y32 = toeplitz_fft_matvec(torch.exp(table.detach()).float(), x.detach().float(), grid)
    y64 = brute_force_toeplitz(torch.exp(table.detach()), x.detach(), grid)
    torch.testing.assert_close(y32.double(), y64, rtol=1e-5, atol=1e-5)


def test_fast_fft_size():
    assert [fast_fft_size(n) for n in (1, 7, 9, 11, 13, 127)] == [1, 8, 9, 12, 15, 128]
