"""rpevit/analysis/kernel_mse.py: the kernel-MSE report on rows from real tiny runs of the task."""
from __future__ import annotations

import math

import pytest

from rpevit.analysis import common, kernel_mse
from tests.analysis_rows import kernel_rows, png_ok, write_sweep

pytestmark = pytest.mark.slow  # runs the kernel_mse task for 32 rows


def test_kernel_mse_report_numbers(tmp_path):
    rows = kernel_rows()
    out = write_sweep(tmp_path / "kmse", "kmse", rows)
    text = kernel_mse.build(out)
    frame = common.load_trials(out, task="kernel_mse")
    assert len(frame) == len(rows) == 32
    one = frame[(frame["kmse_projection"] == "rademacher") & (frame["kmse_estimator"] == "positive")
                & (frame["kmse_features"] == 2)].iloc[0]
    assert f"{common.fmt(one['mse_closed'], 3)} / {common.fmt(one['mse_mc'], 3)}" in text
    assert common.fmt(one["limit_mse"], 3) in text and one["limit_mse"] > 0
    # extremes at m = 4 over the three pairs: the largest positive Gaussian MSE is at |x| = 1.5
    at4 = frame[(frame["kmse_features"] == 4) & (frame["kmse_projection"] == "gaussian")
                & (frame["kmse_estimator"] == "positive")]
    top = at4.loc[at4["mse_closed"].idxmax()]
    assert top["kmse_norm"] == 1.0 and top["kmse_angle"] == 0.8  # |x + y|^2 = 2(1 + cos 0.8) is the largest
    assert f"| 4 | positive | gaussian | 3 | \\|x\\|=1, {math.degrees(0.8):.0f}°: {common.fmt(top['mse_closed'], 3)}" in text
    assert "| trig | gaussian | 3 | 1 |" in text  # x = y at angle 0: the trig estimator is exact, no z
    assert png_ok(out / "kernel_mse_vs_m_0.png")


def test_each_mse_figure_names_the_device_its_rows_ran_on(tmp_path, figures):
    rows = [{**r, "device_name": "cpu:x86_64 Xeon (AVX512) x1 threads"} for r in kernel_rows()]
    kernel_mse.build(write_sweep(tmp_path / "kmse", "kmse", rows))
    assert figures and all("device: cpu:x86_64 Xeon (AVX512) x1 threads" in fig._suptitle.get_text()
                           for fig in figures)
