"""The offsets the rotinv concentration bounds take a union over (analysis/rotinv_concentration.py):
counted against brute force on the integer grid, in the trial's float32 coordinates as in float64."""
import itertools

import pytest
import torch

from rpevit.analysis.rotinv_concentration import distinct_offsets
from rpevit.pe.rotation_invariant import centred_coordinates


def brute_force_offsets(h: int, w: int) -> list[float]:
    """|D|^2 of every nonzero integer offset (dx, dy) up to sign, scaled as centred_coordinates scales."""
    scale = max(h - 1, w - 1, 1)
    seen = set()
    for dx, dy in itertools.product(range(-(w - 1), w), range(-(h - 1), h)):
        if (dx, dy) != (0, 0) and (-dx, -dy) not in seen:
            seen.add((dx, dy))
    return sorted((dx * dx + dy * dy) / scale**2 for dx, dy in seen)


@pytest.mark.parametrize("grid", [(8, 8), (4, 4), (3, 5), (7, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_distinct_offsets_are_the_integer_offsets_up_to_sign(grid, dtype):
    """((2H-1)(2W-1) - 1) / 2 of them: 112 on 8 x 8 (float32 coordinates counted 420 before)."""
    coords = centred_coordinates(grid).to(dtype)
    expected = brute_force_offsets(*grid)
    got = sorted(distinct_offsets(coords).tolist())
    assert len(got) == ((2 * grid[0] - 1) * (2 * grid[1] - 1) - 1) // 2 == len(expected)
    assert got == pytest.approx(expected, rel=1e-6)


def test_coordinates_off_a_grid_are_refused():
    coords = torch.tensor([[0.0, 0.0], [0.3, 0.0], [0.7, 0.25]])  # 0.3 is no multiple of 0.25
    with pytest.raises(ValueError, match="not on a grid"):
        distinct_offsets(coords)
