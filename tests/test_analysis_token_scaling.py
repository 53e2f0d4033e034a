"""The token-scaling analysis (rpevit/analysis/token_scaling.py): exponents, crossovers and the
dense/FFT table, on bench rows whose costs are power laws by construction."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rpevit.analysis import common, efficiency, token_scaling
from tests.analysis_rows import config_row, png_ok, write_sweep

TOKENS = ((32, 64), (64, 256), (128, 1024), (256, 4096))  # image side at patch 4 -> N
# per image: softmax 1e-3 N^2, favor 0.1 N (equal at N = 100); luo dense 2e-3 N^2 vs fft 0.5 N (fft
# faster from N = 250 on, i.e. from the measured 256)
PER_IMAGE = {("softmax", "rope", "auto"): lambda n: 1e-3 * n**2, ("favor", "rope", "auto"): lambda n: 0.1 * n,
             ("softmax", "luo_rpe", "auto"): lambda n: 1e-3 * n**2,
             ("favor", "luo_rpe", "dense"): lambda n: 2e-3 * n**2, ("favor", "luo_rpe", "fft"): lambda n: 0.5 * n}


def scaling_rows(batch_tokens: int = 4096) -> list[dict]:
    rows = []
    for side, n in TOKENS:
        batch = max(1, batch_tokens // n)
        for (attention, pe, path), cost in PER_IMAGE.items():
            t = cost(n) * batch
            rows.append({**config_row(task="bench", attention=attention, pe=pe, luo_path=path, dataset="cifar10",
                                      image_size=side, patch_size=4, bench_batch=batch),
                         "tokens": n, "forward_ms": t / 3, "train_step_ms": t, "infer_ms": t / 4,
                         "step_mem_mb": 1e-2 * n * batch, "out_of_memory": False})
    return rows


def test_exponents_crossovers_and_the_luo_table(tmp_path):
    out = write_sweep(tmp_path / "scaling", "scaling", scaling_rows())
    table = token_scaling.per_image(token_scaling.scaling_rows(common.load_trials(out, task="bench")))
    exps = token_scaling.exponents(table).set_index("variant")
    assert exps.loc["softmax+rope", "train step ms / image exponent"] == pytest.approx(2.0)
    assert exps.loc["favor+rope", "train step ms / image exponent"] == pytest.approx(1.0)
    assert exps.loc["favor+rope", "step memory MiB / image exponent"] == pytest.approx(1.0)
    assert exps.loc["favor+rope", "top decade"] == "1024..4096"  # N >= 4096 / 10
    cross = token_scaling.crossovers(table, token_scaling.exponents(table)).set_index("variant")
    assert cross.loc["favor+rope", "against"] == "softmax+rope"
    assert cross.loc["favor+rope", "overtakes from N"] == pytest.approx(100.0) and cross.loc["favor+rope", "how"] == "measured"
    assert cross.loc["favor+luo_rpe (fft)", "against"] == "softmax+luo_rpe"
    # dense Luo: 2x softmax+luo_rpe at every N, both N^2: never overtakes, no extrapolated crossing
    assert cross.loc["favor+luo_rpe (dense)", "how"] == "not reached"
    assert math.isnan(cross.loc["favor+luo_rpe (dense)", "extrapolated N"])
    assert cross.loc["favor+luo_rpe (dense)", "ratio at largest N"] == pytest.approx(2.0)
    luo = token_scaling.luo_path_table(table)["cpu"]
    assert luo["fft_from_tokens"] == 256 and luo["measured_tokens"] == [64, 256, 1024, 4096]


def test_top_decade_exponent():
    n = np.array([16.0, 64.0, 256.0, 1024.0])
    cost = np.where(n < 100, 50.0, 3 * n**1.5)  # an overhead floor below the top decade is left out
    assert token_scaling.top_decade_exponent(n, cost) == pytest.approx(1.5)
    assert math.isnan(token_scaling.top_decade_exponent(n[:1], cost[:1]))


def test_crossing_cases():
    n = np.array([64.0, 256.0, 1024.0])
    assert token_scaling.crossing(n, np.array([0.5, 0.4, 0.3])) == (64.0, "below the smallest N")
    assert token_scaling.crossing(n, np.array([2.0, 0.5, 1.5]))[1] == "not reached"
    at, how = token_scaling.crossing(n, np.array([0.5, 2.0, 0.5]))  # faster, slower, faster: from the last crossing
    assert how == "measured" and 256 < at < 1024


def test_a_counterpart_out_of_memory_at_the_largest_n_labels_the_last_ratio_with_its_own_n(tmp_path):
    """The last ratio was labelled with the largest common N even where the counterpart had no time there (out
    of memory, as softmax at large N on a GPU): 'ratio at largest N' came from N = 1024, 'largest N' said 4096,
    and an extrapolated crossing was projected from the wrong N."""
    rows = scaling_rows()
    for r in rows:
        if r["attention"] == "softmax" and r["tokens"] == 4096:
            r.update(train_step_ms=math.nan, forward_ms=math.nan, infer_ms=math.nan, step_mem_mb=math.nan,
                     out_of_memory=True)
    out = write_sweep(tmp_path / "scaling", "scaling", rows)
    table = token_scaling.per_image(token_scaling.scaling_rows(common.load_trials(out, task="bench")))
    cross = token_scaling.crossovers(table, token_scaling.exponents(table)).set_index("variant")
    dense = cross.loc["favor+luo_rpe (dense)"]
    assert dense["largest N"] == 1024 and dense["ratio at largest N"] == pytest.approx(2.0)
    assert dense["counterpart out of memory at N"] == "4096"
    rope = cross.loc["favor+rope"]  # 0.1 N against 1e-3 N^2 at N = 1024
    assert rope["largest N"] == 1024 and rope["ratio at largest N"] == pytest.approx(0.1 / (1e-3 * 1024))
    assert "4096" in "\n".join(token_scaling.describe_crossovers(cross.reset_index()))


@pytest.mark.parametrize("gap", [4e-16, -4e-16, 1e-9, 0.01])
def test_parallel_fitted_lines_never_extrapolate_to_inf(gap):
    # issue 39: two exponents equal by construction came out of the fit 4e-16 apart on another BLAS, and
    # 2 ** (1 / 4e-16) overflowed to inf ('not reached' would have been published as N = inf)
    assert math.isnan(token_scaling.extrapolated_crossing(4096.0, 2.0, gap))


def test_extrapolated_crossing_cases():
    assert token_scaling.extrapolated_crossing(256.0, 10.0 / 2.56, 1.0) == pytest.approx(1000.0)
    assert math.isnan(token_scaling.extrapolated_crossing(256.0, 2.0, -1.0))  # the linear one grows faster
    assert math.isnan(token_scaling.extrapolated_crossing(256.0, 1e300, 1.0))  # far beyond the reach: no figure
    assert math.isnan(token_scaling.extrapolated_crossing(256.0, math.nan, 1.0))
    reach = token_scaling.EXTRAPOLATION_REACH
    assert token_scaling.extrapolated_crossing(1.0, reach ** 0.5, 0.5) == pytest.approx(reach)


def test_crossovers_with_a_near_zero_exponent_gap_say_not_reached_without_a_figure(tmp_path):
    out = write_sweep(tmp_path / "scaling", "scaling", scaling_rows())
    table = token_scaling.per_image(token_scaling.scaling_rows(common.load_trials(out, task="bench")))
    exps = token_scaling.exponents(table)
    col = "train step ms / image exponent"
    exps.loc[exps["variant"] == "favor+luo_rpe (dense)", col] -= 4e-16  # what the fit gave on CI's BLAS
    cross = token_scaling.crossovers(table, exps).set_index("variant")
    assert cross.loc["favor+luo_rpe (dense)", "how"] == "not reached"
    assert math.isnan(cross.loc["favor+luo_rpe (dense)", "extrapolated N"])
    assert "inf" not in "\n".join(token_scaling.describe_crossovers(cross.reset_index()))


def test_an_unreached_crossover_is_extrapolated_from_the_exponents(tmp_path):
    rows = [r for r in scaling_rows() if r["tokens"] <= 256 or r["attention"] != "favor"]
    for r in rows:  # favor 10x slower: 0.1 N * 10 = N vs 1e-3 N^2 -> equal at N = 1000 (beyond 256)
        if r["attention"] == "favor" and r["pe"] == "rope":
            r["train_step_ms"] *= 10
    out = write_sweep(tmp_path / "scaling", "scaling", [r for r in rows if r["tokens"] <= 256])
    table = token_scaling.per_image(common.load_trials(out, task="bench"))
    cross = token_scaling.crossovers(table, token_scaling.exponents(table)).set_index("variant")
    assert cross.loc["favor+rope", "how"] == "not reached"
    assert cross.loc["favor+rope", "extrapolated N"] == pytest.approx(1000.0)


@pytest.mark.slow
def test_build_writes_the_section_and_figure_and_the_crossover_file(tmp_path):
    parent = tmp_path / "all"
    write_sweep(parent / "scaling", "scaling", scaling_rows())
    text = token_scaling.build(parent)
    assert "Where each linear variant overtakes its softmax counterpart" in text
    assert "FFT path faster from N = 256" in text and png_ok(parent / "token_scaling.png")
    assert efficiency.build(parent) is not None and "Token scaling" not in efficiency.build(parent)
    path = tmp_path / "luo_crossover.json"
    path.write_text(json.dumps({"cuda": {"fft_from_tokens": 8192}}))
    token_scaling.write_crossover(parent, path)
    written = json.loads(path.read_text())
    assert written["cuda"] == {"fft_from_tokens": 8192} and written["cpu"]["fft_from_tokens"] == 256


def test_out_of_memory_rows_are_shown_and_left_out_of_the_fit(tmp_path):
    rows = scaling_rows()
    for r in rows:
        if r["attention"] == "softmax" and r["pe"] == "rope" and r["tokens"] == 4096:
            r.update(out_of_memory=True, train_step_ms=math.nan, infer_ms=math.nan, step_mem_mb=math.nan)
    out = write_sweep(tmp_path / "scaling", "scaling", rows)
    table = token_scaling.per_image(common.load_trials(out, task="bench"))
    exps = token_scaling.exponents(table).set_index("variant")
    assert exps.loc["softmax+rope", "out of memory at N"] == "4096"
    assert exps.loc["softmax+rope", "train step ms / image exponent"] == pytest.approx(2.0)  # over the sizes that ran


def test_the_crossover_file_is_never_written_through_a_link(tmp_path):
    parent = tmp_path / "all"
    write_sweep(parent / "scaling", "scaling", scaling_rows())
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "luo_crossover.json"
    link.symlink_to(victim)
    with pytest.raises(SystemExit, match=r"^error: .*luo_crossover.json is a symbolic link .*allowed: a regular file"):
        token_scaling.write_crossover(parent, link)
    assert victim.read_text() == "precious" and link.is_symlink()


def test_the_tables_say_how_few_sizes_a_fit_has_where_a_ratio_starts_and_what_the_luo_figures_pool(tmp_path):
    """A reviewer: relu+luo_rpe (fft), measured at two sizes, read as a 'top decade' fit with its ratio 'at the
    smallest N' (2304, while other rows start at 64), the dense / FFT table pooled favor and relu unnamed, and
    N printed as 1.04e+03. Each is now said: sizes in the fit, the smallest N, the backends per path and N."""
    rows = scaling_rows() + [{**r, "attention": "relu"} for r in scaling_rows()
                             if r["pe"] == "luo_rpe" and r["luo_path"] == "fft" and r["tokens"] >= 1024]
    out = write_sweep(tmp_path / "scaling", "scaling", rows)
    table = token_scaling.per_image(token_scaling.scaling_rows(common.load_trials(out, task="bench")))
    exps = token_scaling.exponents(table).set_index("variant")
    assert exps.loc["relu+luo_rpe (fft)", "sizes in the fit"] == 2 and exps.loc["favor+rope", "sizes in the fit"] == 2
    cross = token_scaling.crossovers(table, token_scaling.exponents(table)).set_index("variant")
    assert cross.loc["relu+luo_rpe (fft)", "smallest N"] == 1024 and cross.loc["favor+rope", "smallest N"] == 64
    device = table["device"].iloc[0]
    assert token_scaling.luo_path_backends(table, device) == "dense: favor; fft: favor at N = 64, 256; favor, relu at N = 1024, 4096"
    shown = "\n".join(token_scaling.describe_crossovers(token_scaling.crossovers(table, token_scaling.exponents(table))))
    assert "e+0" not in shown
    assert "sizes in the fit" in token_scaling.build(out)
    import pandas as pd

    assert token_scaling.timing_text(pd.DataFrame({"timing_repeats": [5, 5], "timing_interleaved": [True, True]})) \
        == "Medians of 5 interleaved timed runs"  # from the rows, not a typed 3
    assert token_scaling.timing_text(pd.DataFrame({"timing_repeats": [3], "timing_interleaved": [False]})) \
        == "Medians of 3 timed runs"


def test_o_n_by_construction_follows_the_backend_and_the_encodings_not_the_name(tmp_path):
    """An audit: the cost summary counted every non-softmax variant but luo_rpe's '(dense)' rows as O(N), by
    name, so a new score-hook encoding through an N x N matrix on FAVOR+ would have entered 'the O(N) variants'
    exponent'. Now: the backend's linear_time and each encoding's quadratic_on_kernelized."""
    from rpevit import registry
    from tests.test_one_file_variants import THROWAWAY, THROWAWAY_BACKEND_AND_TASK, imported_file

    linear = token_scaling.linear_in_tokens
    assert linear("favor", "rope", {}) and linear("relu", "ape", {}) and not linear("softmax", "rope", {})
    assert linear("favor", "luo_rpe", {"luo_path": "fft"}) and not linear("favor", "luo_rpe", {"luo_path": "dense"})
    assert not linear("favor", "ape+luo_rpe", {"luo_path": "dense"}) and linear("favor", "ape+luo_rpe", {"luo_path": "fft"})
    assert linear("favor", "rotinv", {"rotinv_path": "lowrank"}) and not linear("favor", "rotinv", {"rotinv_path": "dense"})
    assert not linear("no_such_backend", "ape", {}) and not linear("favor", "no_such_pe", {})
    with imported_file(tmp_path, "throwaway_encodings", THROWAWAY, (registry.POSITION_ENCODINGS,)):
        # a score hook whose class does not say otherwise is an N x N modulation; the other hooks act per token
        assert not linear("favor", "throwaway_gauss", {}) and linear("favor", "throwaway_rope_x", {})
    with imported_file(tmp_path, "throwaway_backend", THROWAWAY_BACKEND_AND_TASK,
                       (registry.ATTENTIONS, registry.TASKS, registry.METRICS)):
        assert linear("throwaway_elu", "rope", {})  # a new backend says linear_time = True


def test_the_per_image_table_marks_which_variants_are_o_n(tmp_path):
    out = write_sweep(tmp_path / "scaling", "scaling", scaling_rows())
    table = token_scaling.per_image(token_scaling.scaling_rows(common.load_trials(out, task="bench")))
    marked = table.groupby("variant")["linear_in_tokens"].first().to_dict()
    assert marked == {"favor+luo_rpe (dense)": False, "favor+luo_rpe (fft)": True, "favor+rope": True,
                      "softmax+luo_rpe": False, "softmax+rope": False}
