"""rpevit/analysis/string_study.py: STRING variants ranked against rope, their costs and the f sweep."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from rpevit.analysis import common, efficiency, report, string_study
from rpevit.analysis.stats import mean_interval, welch
from tests.analysis_rows import assert_readable_and_inside, config_row, write_sweep


STRING_ACC = {  # (pe, f, solver): test accuracy of seeds 0..2
    ("rope", 0.1, "auto"): [0.90, 0.91, 0.92],
    ("cayley_string", 0.1, "auto"): [0.93, 0.94, 0.95],
    ("sparse_cayley_string", 0.05, "auto"): [0.90, 0.90, 0.91],
    ("sparse_cayley_string", 0.5, "auto"): [0.92, 0.92, 0.93],
    ("sparse_cayley_string", 0.1, "auto"): [0.91, 0.91, 0.92],
    ("sparse_cayley_string", 0.1, "sparse"): [0.91, 0.92, 0.92],
}


@pytest.mark.slow
def test_string_study_ranks_variants_against_rope_with_costs_and_the_f_sweep(tmp_path):
    rows, bench = [], []
    for (pe, f, solver), accs in STRING_ACC.items():
        options = {"pe": pe, "string_sparsity": f, "cayley_solver": solver, "dataset": "digits"}
        rows += [{**config_row(**options, seed=seed), "test_acc": acc} for seed, acc in enumerate(accs)]
        step = {"rope": 30.0, "cayley_string": 36.0}.get(pe, 33.0) * (1.5 if solver == "sparse" else 1.0)
        bench.append({**config_row(task="bench", image_size=8, patch_size=2, bench_batch=10, **options),
                      "tokens": 16, "train_step_ms": step, "infer_ms_per_sample": step / 100})
    bench.append({**config_row(task="bench", pe="ape", dataset="digits", image_size=8, patch_size=2, bench_batch=10),
                  "tokens": 16, "train_step_ms": 20.0, "infer_ms_per_sample": 0.2})  # not a STRING: ignored
    parent = tmp_path / "results"
    write_sweep(parent / "string", "string", rows)
    write_sweep(parent / "cost", "cost", bench)
    # rope's seeds trained again in another sweep (as in the converged MNIST study): each seed counts once
    again = [{**r, "rotinv_mode": "exact", "test_acc": r["test_acc"] + 0.002} for r in rows if r["pe"] == "rope"]
    write_sweep(parent / "converged", "converged", again)
    frame = common.load_trials(parent)
    table = string_study.with_costs(string_study.string_rows(frame[frame["task"] == "train"]),
                                    string_study.bench_ratios(frame[frame["task"] == "bench"]))
    ranked = string_study.variant_table(table)
    rope = ranked.set_index("variant").loc["rope"]
    assert rope["seeds"] == 3 and rope["acc"] == pytest.approx(np.mean(STRING_ACC[("rope", 0.1, "auto")]) + 0.001)
    best = ranked.iloc[0]
    assert best["variant"] == "cayley_string" and best["acc"] == pytest.approx(0.94)
    assert best["diff"].point == pytest.approx(0.029) and best["diff"].lo > 0  # its own 95% interval excludes 0,
    assert best["holm"].k == 5 and not best["holm"].resolved  # but not at its Holm level among 5 variants vs rope
    rope_seeds = np.array(STRING_ACC[("rope", 0.1, "auto")]) + 0.001
    assert best["diff"].p == pytest.approx(sps.ttest_ind(STRING_ACC[("cayley_string", 0.1, "auto")], rope_seeds,
                                                         equal_var=False).pvalue)
    assert best["train x rope"] == pytest.approx(1.2) and best["infer x rope"] == pytest.approx(1.2)
    solver_row = ranked[ranked["variant"].str.contains("cayley_solver=sparse")].iloc[0]
    assert solver_row["train x rope"] == pytest.approx(33 * 1.5 / 30)
    fs = string_study.f_table(table).set_index(["f", "solver"])
    assert fs.loc[(0.5, "auto"), "acc"] == pytest.approx(np.mean([0.92, 0.92, 0.93]))
    text = string_study.build(parent)
    assert "The highest mean is cayley_string" in text and "1.2x rope's training-step time" in text
    assert "vs rope at its Holm level: not resolved with 3 seeds" in text
    assert "No difference to rope is resolved by Holm over the k = 5 with 3 seeds." in text
    assert "highest mean at f = 0.5" in text and "The sparse solver at f = 0.1" in text
    assert "| reference notebook, epoch x rope |" in text  # digits: the notebook has no figure, so "—"
    assert (parent / "string_study_f.png").stat().st_size > 1000
    assert "## The STRING study" in report.build_report(parent)
    assert "| softmax | rope | none | off | 3 |" in efficiency.build(parent)  # seeds, each counted once
    # rope and one other STRING, no sparse rows (the converged MNIST study alone): no f table, no plot
    few = tmp_path / "few"
    write_sweep(few / "string", "string", [r for r in rows if r["pe"] in ("rope", "cayley_string")])
    text = string_study.build(few)
    assert "The highest mean is cayley_string" in text and "against f" not in text
    # alone in its family, its 95% interval decides
    assert "Holm over the k = 1: cayley_string above rope (" in text and "not resolved" not in text
    assert not (few / "string_study_f.png").exists()


def test_string_study_names_the_reference_notebooks_ratio_only_where_it_measured_one():
    ratio = string_study.notebook_ratio
    assert ratio("mnist", "cayley_string", None) == "5.5" and ratio("cifar10", "cayley_string", None) == "18.7"
    assert ratio("mnist", "sparse_cayley_string", 1.0) == ratio("cifar10", "sparse_cayley_string", 1.0) == "up to 221 (dataset not given)"
    assert ratio("cifar10", "sparse_cayley_string", 0.1) == "—"  # the notebook gave f = 1 only
    assert ratio("digits", "cayley_string", None) == "—" and ratio("mnist", "rope", None) == "—"


def test_string_f_plot_draws_no_interval_from_one_seed(tmp_path, figures):
    one = pd.DataFrame({"f": [0.1, 0.5], "solver": ["auto", "auto"], "seeds": [1, 1], "acc": [0.9, 0.91],
                        "acc_text": ["", ""], "values": [np.array([0.9]), np.array([0.91])]})
    string_study.plot_f({"mnist": one}, tmp_path / "f.png")
    fig = figures[-1]
    assert "95%" not in fig._suptitle.get_text() and "no interval" in fig._suptitle.get_text()
    assert not [c for ax in fig.axes for c in ax.containers]
    assert_readable_and_inside(fig)
    three = one.assign(values=[np.array([0.9, 0.91, 0.92]), np.array([0.9, 0.92, 0.91])])
    string_study.plot_f({"mnist": three}, tmp_path / "f.png")
    assert "95% t interval" in figures[-1]._suptitle.get_text() and "n = 3 seeds" in figures[-1].axes[0].get_title()


def solver_rows(dense: list[float], sparse: list[float], sparse_seeds: list[int] | None = None) -> pd.DataFrame:
    """Train rows (already one per seed) of rope and sparse-S Cayley at f = 0.1 with the dense and the sparse solver."""
    out = []
    for pe, solver, accs, seeds in (("rope", "auto", [0.90, 0.91, 0.92], [0, 1, 2]),
                                    (string_study.SPARSE, "auto", dense, [0, 1, 2]),
                                    (string_study.SPARSE, "sparse", sparse, sparse_seeds or [0, 1, 2])):
        out += [{"dataset": "cifar10", "variant": f"{pe} {solver}", "pe": pe, "seed": seed, "test_acc": acc,
                 "string_sparsity": 0.1, "cayley_solver": solver, "train x rope": math.nan, "infer x rope": math.nan}
                for seed, acc in zip(seeds, accs)]
    return pd.DataFrame(out)


def solver_sentence(rows: pd.DataFrame) -> str:
    text = string_study.verdict("CIFAR-10", string_study.variant_table(rows), string_study.f_table(rows))
    return text[text.index("The sparse solver"):]


def test_the_solver_check_pairs_by_seed_and_says_identical_runs_in_words():
    """The sparse and the dense solve compute the same P, and a seed run by both is one paired observation:
    identical runs (cifar10_cpu: 60.24, 59.69, 60.41 with both) are said to be identical seed for seed, not
    given a Welch interval of +-0.85 points around an exact 0; runs that differ get the one-sample t interval
    of their per-seed differences (n = shared seeds); Welch only where no seed is shared."""
    same = [0.6024, 0.5969, 0.6041]
    text = solver_sentence(solver_rows(same, same))
    assert "(identical seed for seed: difference 0 in each of the 3 seeds)." in text
    assert "[" not in text.split("with the dense solve")[1] and "n=3,3" not in text
    # seeds that differ by a constant 0.1 point but spread 0.6 points across seeds: paired, the seed spread cancels
    moved = [a + 0.001 * (1 + 0.1 * i) for i, a in enumerate(same)]
    text = solver_sentence(solver_rows(same, moved))
    paired = mean_interval(np.array(moved) - np.array(same))
    assert f"(difference, points, paired by seed: {paired.text(scale=100)}: one check, 95%)." in text
    assert "(n=3)" in text and "n=3,3" not in text and paired.excludes(0.0)
    # one seed run by one solver only: paired over the two shared, the other named as left out
    text = solver_sentence(solver_rows(same, moved[:2] + [0.7], sparse_seeds=[0, 1, 5]))
    pair = mean_interval(np.array(moved[:2]) - np.array(same[:2]))
    assert f"paired by seed: {pair.text(scale=100)}: one check, 95%; 2 seeds run by one solver only left out)" in text
    # no seed shared: the two are independent samples, Welch
    text = solver_sentence(solver_rows(same, moved, sparse_seeds=[3, 4, 5]))
    assert f"Welch (the two solvers share no seed): {welch(moved, same).text(scale=100)}: one check, 95%" in text


def test_two_names_for_the_same_runs_count_once_in_the_holm_family():
    """Sparse-S Cayley at f = 1 computes dense Cayley-STRING's P: where its seeds' accuracies equal another
    variant's seed for seed (cifar10_cpu: 60.13 [59.15, 61.11] both), the family counts distinct models, the
    copy shares the verdict of the one it repeats and the text says it was judged once."""
    rows = solver_rows([0.93, 0.94, 0.95], [0.93, 0.94, 0.95])  # the sparse solve repeats the dense one exactly
    table = string_study.variant_table(rows)
    dense, sparse = (table.set_index("variant").loc[f"{string_study.SPARSE} {s}"] for s in ("auto", "sparse"))
    assert dense["holm"].k == 1 and sparse["holm"] is dense["holm"]  # one distinct model against rope, not two
    assert sparse["same_as"] == f"{string_study.SPARSE} auto" and pd.isna(dense["same_as"])
    # alone in its family its 95% interval decides; with k = 2 (counted twice) its Holm level would be 97.5%
    assert dense["holm"].interval.level == pytest.approx(0.95)
    text = string_study.verdict("CIFAR-10", table, string_study.f_table(rows))
    assert f"Judged once, as the same runs seed for seed (the same accuracy in every seed): " \
           f"{string_study.SPARSE} sparse repeats {string_study.SPARSE} auto." in text
    assert "Holm over the k = 1:" in text
    # one seed differs in its last digit: two models, two comparisons
    apart = string_study.variant_table(solver_rows([0.93, 0.94, 0.95], [0.93, 0.94, 0.9501]))
    assert apart["same_as"].isna().all() and {h.k for h in apart["holm"].dropna()} == {2}


def string_bench_rows(times: dict[str, tuple[float, ...]]) -> list[dict]:
    """Bench trials of digits' model (10 images per batch), one per seed: pe -> training-step ms of each trial
    (inference ms per sample: the step / 100)."""
    return [{**config_row(task="bench", pe=pe, dataset="digits", image_size=8, patch_size=2, bench_batch=10,
                          seed=seed), "tokens": 16, "train_step_ms": t, "infer_ms_per_sample": t / 100}
            for pe, ts in times.items() for seed, t in enumerate(ts)]


def string_train_rows(pes: dict[str, list[float]]) -> list[dict]:
    """Train rows of digits: pe -> test accuracy of seeds 0, 1, ..."""
    return [{**config_row(pe=pe, dataset="digits", seed=seed), "test_acc": acc}
            for pe, accs in pes.items() for seed, acc in enumerate(accs)]


def study_row(text: str, variant: str) -> dict[str, str]:
    """Header -> cell of `variant`'s row in the first accuracy-and-cost table of a build() text."""
    lines = text.splitlines()
    cells = lambda line: [cell.strip() for cell in line.strip().strip("|").split(" | ")]  # noqa: E731
    header = next(line for line in lines if line.startswith("| variant |"))
    return dict(zip(cells(header), cells(next(line for line in lines if line.startswith(f"| {variant} |")))))


@pytest.mark.slow  # writes and reads Parquet sweeps, builds the section: over 1 s
def test_string_cost_ratios_carry_the_efficiency_sections_interval_and_one_trial_note(tmp_path):
    """The x-rope ratios are efficiency.with_ratios' (one code path for both sections): the ratio of medians over
    bench trials as before, with the 95% interval of the ratio of geometric means (Welch on log times) where both
    sides have 2 or more trials, plain with the efficiency section's note where a side has one."""
    parent = tmp_path / "results"
    write_sweep(parent / "string", "string", string_train_rows({"rope": [0.90, 0.91, 0.92],
                                                                "cayley_string": [0.95, 0.96, 0.97],
                                                                "reflection_string": [0.89, 0.90, 0.91]}))
    times = {"rope": (30.0, 32.0, 31.0), "cayley_string": (40.0, 44.0, 42.0), "reflection_string": (50.0,)}
    write_sweep(parent / "cost", "cost", string_bench_rows(times))
    bench = common.load_trials(parent, "bench")
    ratios = string_study.bench_ratios(bench).set_index("pe")
    expected = efficiency.ratio_interval(times["cayley_string"], times["rope"])
    got = ratios.loc["cayley_string", "train x rope" + efficiency.RATIO_INTERVAL]
    assert ratios.loc["cayley_string", "train x rope"] == pytest.approx(42.0 / 31.0)  # the ratio of medians
    assert (got.lo, got.hi) == pytest.approx((expected.lo, expected.hi)) and got.n == (3, 3)
    assert ratios.loc["reflection_string", "train x rope" + efficiency.RATIO_INTERVAL].n == (1, 3)
    assert ratios.loc["rope", "train x rope" + efficiency.RATIO_INTERVAL] is None  # its own reference: 1
    # the same figure and interval as the efficiency section's bench table of the same rows
    alone = efficiency.bench_cost_table(bench).set_index("pe")
    for pe in times:
        for name in ("train x rope", "infer x rope"):
            assert ratios.loc[pe, name] == pytest.approx(alone.loc[pe, name])
            ours, theirs = (t.loc[pe, name + efficiency.RATIO_INTERVAL] for t in (ratios, alone))
            assert (ours is None) == (theirs is None)
            if ours is not None:
                assert (ours.lo, ours.hi) == pytest.approx((theirs.lo, theirs.hi), nan_ok=True) and ours.n == theirs.n
    text = string_study.build(parent)
    cell = f"{common.fmt(42.0 / 31.0)} [{common.fmt(expected.lo)}, {common.fmt(expected.hi)}] (n=3,3)"
    cayley = study_row(text, "cayley_string")
    assert cayley["train step x rope"] == cayley["inference x rope"] == cell, cayley
    assert study_row(text, "reflection_string")["train step x rope"] == common.fmt(50.0 / 31.0)  # one trial: plain
    assert study_row(text, "rope")["train step x rope"] == "1"
    assert ("It costs 1.35x [" in text and "(n=3,3) rope's training-step time" in text
            and "(bench, alone)." in text)  # the verdict's best variant, with its interval
    assert "Beside a ratio: the 95% interval of the ratio of geometric means over bench trials" in text
    assert "2 of the 4 ratios rest on one bench trial on a side and are printed plain" in text
    # every ratio on one bench trial: none has an interval, said once under the tables and in the verdict
    one = tmp_path / "one"
    write_sweep(one / "string", "string", string_train_rows({"rope": [0.90, 0.91, 0.92],
                                                             "cayley_string": [0.95, 0.96, 0.97]}))
    write_sweep(one / "cost", "cost", string_bench_rows({"rope": (30.0,), "cayley_string": (42.0,)}))
    text = string_study.build(one)
    assert study_row(text, "cayley_string")["train step x rope"] == common.fmt(1.4)
    assert "No ratio here has an interval: each rests on one bench trial of the variant or of the reference" in text
    assert "It costs 1.4x rope's training-step time and 1.4x its inference time (bench, alone; no interval: " \
           "one bench trial on a side)." in text


def test_auto_is_the_solve_the_encoding_resolves_it_to():
    """string_study reads a row's solve from its requested cayley_solver: pinned here to what
    SparseCayleyString itself runs for each allowed value, at several f and head dims, so a change of the
    `auto` rule there fails until the analysis follows it."""
    from rpevit.pe.cayley_string import CAYLEY_SOLVER, SparseCayleyString
    for value in CAYLEY_SOLVER.choices:
        for f in (0.05, 0.1, 0.5, 1.0):
            for head_dim in (8, 32):
                pe = SparseCayleyString(grid=(4, 4), heads=2, head_dim=head_dim, string_sparsity=f, cayley_solver=value)
                assert string_study.resolved_solver(value) == pe.solver, (value, f, head_dim)
    assert string_study.resolved_solver(math.nan) == string_study.resolved_solver(None) == "dense"  # the default
    assert string_study.resolved_solver("forged") is None and string_study.resolved_solver(1.0) is None


@pytest.mark.slow  # writes and reads Parquet sweeps, builds the section: over 1 s
def test_f_table_counts_auto_as_dense_and_an_unknown_solver_as_neither(tmp_path):
    """A forged cayley_solver (read from an untrusted file) is not the dense solve: it stays out of the f curve
    and the solver check, shows under its own label and is named in one line with the allowed values; "auto"
    counts as the dense LU it runs and says so in the f table."""
    dense, sparse = [0.91, 0.92, 0.93], [0.915, 0.925, 0.935]
    rows = [{**config_row(pe="rope", dataset="digits", seed=s), "test_acc": a} for s, a in enumerate([0.9, 0.9, 0.91])]
    for f, solver, accs in ((0.1, "auto", dense), (0.1, "sparse", sparse), (0.5, "dense", [0.92, 0.93, 0.94]),
                            (0.5, "forged", [0.99, 0.99, 0.995]), (0.2, "faster", [0.98, 0.98, 0.985])):
        for seed, acc in enumerate(accs):
            row = {**config_row(pe=string_study.SPARSE, dataset="digits", string_sparsity=f, seed=seed), "test_acc": acc}
            rows.append({**row, "cayley_solver": solver})  # as a file forged after the config check would hold it
    parent = tmp_path / "results"
    write_sweep(parent / "string", "string", rows)
    text = string_study.build(parent)
    assert "Across f = 0.1, 0.5, mean accuracy spans 92-93% (highest mean at f = 0.5)." in text, text
    assert f"against {mean_interval(np.array(dense)).text(scale=100, digits=4)} with the dense solve" in text
    assert "| 0.1 | auto (dense) | 3 |" in text and "| 0.5 | dense | 3 |" in text and "| 0.1 | sparse | 3 |" in text
    assert "| 0.5 | forged (not an allowed value) | 3 |" in text and "| 0.2 | faster (not an allowed value) | 3 |" in text
    assert ("Counted as neither solve: sparse_cayley_string rows whose field 'cayley_solver' has a value it does not "
            "allow (`faster` at f = 0.2; `forged` at f = 0.5); allowed: auto, dense, sparse (auto: the dense solve)."
            in text)
    fs = string_study.f_table(string_study.string_rows(common.load_trials(parent, "train"))).set_index(["f", "solver"])
    assert fs["resolved"].to_dict() == {(0.1, "auto"): "dense", (0.1, "sparse"): "sparse", (0.2, "faster"): None,
                                        (0.5, "dense"): "dense", (0.5, "forged"): None}
    # the forged rows alone beside a sparse row: no dense row to check the sparse solver against, no curve
    alone = solver_rows(dense, sparse).replace({"cayley_solver": {"auto": "forged"}})
    text = string_study.verdict("CIFAR-10", string_study.variant_table(alone), string_study.f_table(alone))
    assert "The sparse solver" not in text and "Across f" not in text
    # a row without the field ran its default, auto: the dense solve, not dropped from the table
    missing = solver_rows(dense, sparse).replace({"cayley_solver": {"auto": None}})
    fs = string_study.f_table(missing)
    assert list(zip(fs["solver"], fs["resolved"], fs["seeds"])) == [("auto", "dense", 3), ("sparse", "sparse", 3)]
    assert "with the dense solve" in solver_sentence(missing)


def test_the_f_plot_and_the_cost_tables_name_their_devices(tmp_path, figures):
    one = pd.DataFrame({"f": [0.1, 0.5], "solver": ["auto", "auto"], "seeds": [1, 1], "acc": [0.9, 0.91],
                        "acc_text": ["", ""], "values": [np.array([0.9]), np.array([0.91])]})
    string_study.plot_f({"mnist": one}, tmp_path / "f.png", "device: NVIDIA H200")
    assert "device: NVIDIA H200" in figures[-1]._suptitle.get_text()
    frame = pd.DataFrame([{**config_row(task=task, attention="softmax", pe=pe, dataset="mnist", seed=0),
                           "device_name": device, "test_acc": 0.9}
                          for task, pe, device in (("train", string_study.SPARSE, "Train CPU A"),
                                                   ("train", "rope", "Train CPU B"),
                                                   ("bench", "rope", "Bench GPU C"),
                                                   ("bench", "rope", "Bench GPU C"))])
    assert string_study.f_devices(frame, ["mnist"]) == "device: Train CPU A"  # the sparse-S rows drawn
    assert string_study.bench_devices(frame, "mnist") == "device: Bench GPU C"
    assert string_study.bench_devices(frame, "cifar10") == "device unknown"
