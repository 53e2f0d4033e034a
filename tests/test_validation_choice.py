"""The validation-choice report on constructed rows with known answers: the candidate with the best
mean validation accuracy is chosen (draw mean for random-feature rows), its test figure is read, and
a change of choice is claimed only when the Holm-corrected interval excludes 0, paired by seed (the
candidates of a cell ran the same seeds), Welch only where they share fewer than 2 seeds."""
from __future__ import annotations

import math

import numpy as np
from scipy import stats as scipy_stats

from rpevit.analysis import stats, validation_choice
from rpevit.analysis.common import load_trials
from tests.analysis_rows import config_row, write_sweep

# (attention, luo_scale) -> per-seed validation accuracy; favor is judged on its validation draw mean
VAL = {("softmax", 3.0): [0.950, 0.952, 0.951], ("softmax", 10.0): [0.940, 0.941, 0.942],
       ("favor", 3.0): [0.90, 0.95, 0.93], ("favor", 10.0): [0.92, 0.91, 0.93]}
TEST = {("softmax", 3.0): 0.96, ("softmax", 10.0): 0.95, ("favor", 3.0): 0.94, ("favor", 10.0): 0.93}


def rows(val_by_cell: dict = VAL) -> list[dict]:
    """One row per (attention, luo_scale) and seed; values a list (seeds 0, 1, ...) or seed -> value."""
    out = []
    for (attention, scale), values in val_by_cell.items():
        for seed, val in (values.items() if isinstance(values, dict) else enumerate(values)):
            row = {**config_row(attention=attention, pe="luo_rpe", luo_scale=scale, seed=seed, dataset="digits",
                                redraw_interval=100 if attention == "favor" else 0),
                   "test_acc": 0.5, "test_acc_draw_mean": float("nan"), "final_val_acc": 0.5,
                   "val_acc_draw_mean": float("nan")}
            if attention == "favor":  # one-draw figures say the opposite: they must not be what is chosen on
                row.update(final_val_acc=1.0 - val, val_acc_draw_mean=val, test_acc=0.99,
                           test_acc_draw_mean=TEST[(attention, scale)])
            else:
                row.update(final_val_acc=val, test_acc=TEST[(attention, scale)])
            out.append(row)
    return out


def test_the_validation_choice_by_hand(tmp_path):
    out = write_sweep(tmp_path / "luo", "luo", rows())
    text = validation_choice.build(out)
    assert "Knob: **luo_scale**" in text
    # softmax: 3 wins on validation by 0.01 with tiny spread: Holm (k=2) resolves it
    softmax = next(line for line in text.splitlines() if line.startswith("- digits / softmax"))
    assert "validation chooses 3, not the earlier 10" in softmax and "better on validation" in softmax
    assert "96 [" in softmax  # its test figure: 0.96 on every seed
    # favor: 3 has the higher validation DRAW mean (0.9267 vs 0.92) but a wide spread: not resolved
    favor = next(line for line in text.splitlines() if line.startswith("- digits / favor"))
    assert "validation chooses 3" in favor and "not resolved with 3 seeds" in favor
    assert "93 [" in favor  # the earlier choice's test draw mean, beside
    assert "**chosen on validation**" in text and "(earlier choice)" in text
    assert "It is the smallest luo_scale tried: the best may lie beyond the grid" in softmax  # 3 of {3, 10}


def test_the_edge_of_the_grid():
    def edge(chosen, candidates):
        knob = ("luo_scale",) if len(chosen) == 1 else ("redraw_interval", "redraw_until")
        return validation_choice.edge_of_grid(knob, chosen, candidates)

    assert edge((30.0,), [(1.0,), (10.0,), (30.0,)]) == "largest"
    assert edge((10.0,), [(1.0,), (10.0,), (30.0,)]) is None
    redraws = [(0, 0.8), (30, 0.8), (100, 0.8), (300, 0.8), (100, 1.0)]
    assert edge((30, 0.8), redraws) == "smallest"  # 0 (never redraw) is not on the interval scale
    assert edge((100, 0.8), redraws) is None
    assert edge((1, 0.8), [(1, 0.8), *redraws]) is None  # every step: the end of the scale, nothing beyond
    assert edge((0, 0.8), redraws) is None and edge((100, 1.0), redraws) is None  # off; a schedule tried alone


def test_no_change_is_said_plainly(tmp_path):
    kept = [r for r in rows() if not (r["attention"] == "softmax" and r["luo_scale"] == 3.0)]
    text = validation_choice.build(write_sweep(tmp_path / "kept", "kept", kept))
    assert "- digits / softmax / luo_rpe: validation chooses 10, the earlier choice: it does not change." in text


def test_failed_candidates_are_shown_and_count_as_tried(tmp_path):
    """favor at luo_scale 30 diverges on every seed: listed with its error, never chosen, and it makes 10
    an interior value of the favor grid (tried 3, 10, 30)."""
    diverged = [(config_row(attention="favor", pe="luo_rpe", luo_scale=30.0, seed=seed, dataset="digits",
                            redraw_interval=100), "rpevit.tasks.train.DivergedError: training loss is nan at epoch 2")
                for seed in range(3)]
    text = validation_choice.build(write_sweep(tmp_path / "luo", "luo", rows(), failed=diverged))
    assert "| digits / favor / luo_rpe | 30 |" in text and "3 of 3 seeds failed: training loss is nan at epoch 2" in text
    favor = next(line for line in text.splitlines() if line.startswith("- digits / favor"))
    assert "validation chooses 3" in favor and "30 failed in 3 of 3 seeds (training loss is nan at epoch 2)" in favor
    assert "It is the smallest luo_scale tried" in favor  # 3 is still the low end; the failure is above
    softmax = next(line for line in text.splitlines() if line.startswith("- digits / softmax"))
    assert "failed" not in softmax


# the recipe: one choice for every variant alike. (lr, init, clip) -> per-seed validation accuracy, per cell
RECIPE_VAL = {("softmax", "rope"): {(2e-3, "trunc_normal", 1.0): [0.90, 0.91], (2e-3, "torch_default", 1.0): [0.95, 0.96],
                                    (4e-3, "torch_default", 1.0): [0.97, 0.96]},
              ("favor", "ape"): {(2e-3, "trunc_normal", 1.0): [0.93, 0.94], (2e-3, "torch_default", 1.0): [0.94, 0.95],
                                 (4e-3, "torch_default", 1.0): [0.90, 0.91]}}


def recipe_rows() -> list[dict]:
    out = []
    for (attention, pe), candidates in RECIPE_VAL.items():
        for (lr, init, clip), values in candidates.items():
            for seed, val in enumerate(values):
                row = {**config_row(attention=attention, pe=pe, lr=lr, init=init, grad_clip=clip, seed=seed,
                                    dataset="mnist", redraw_interval=10 if attention == "favor" else 0),
                       "test_acc": 0.5, "test_acc_draw_mean": 0.5, "final_val_acc": val, "val_acc_draw_mean": val}
                out.append(row)
    return out


def test_the_recipe_is_one_choice_for_every_variant(tmp_path):
    text = validation_choice.build(write_sweep(tmp_path / "recipe", "recipe", recipe_rows()))
    # the earlier choice of the rows' dataset only (cifar10's is not these rows')
    assert "Knob: **lr / init / grad_clip**; the earlier choice (made on test): 0.002, trunc_normal, 1." in text
    assert "0.001, trunc_normal" not in text
    # per cell, softmax+rope would take lr 4e-3 and favor+ape 2e-3; alike for both, the mean over cells picks
    # 2e-3 torch_default (0.95 against 0.935 for 4e-3 and 0.92 for the earlier trunc_normal)
    assert "Validation chooses 0.002, torch_default, 1 for every variant, not the earlier 0.002, trunc_normal, 1" in text
    joint = text.split("### One choice for every variant alike")[1]
    assert joint.index("0.002, torch_default, 1 **chosen on validation**") < joint.index("0.004, torch_default, 1")
    assert validation_choice.joint_choice(validation_choice.RECIPE, []) is None


def test_a_recipe_that_fails_in_one_cell_brackets_the_joint_choice(tmp_path):
    """lr 8e-3 (torch_default, clip 1) diverges on every favor seed and trains softmax: it cannot be chosen
    for every variant, yet it was tried, so the joint choice 4e-3 is not "the largest lr tried" (the
    recipe_val_mnist case: stage 3's 8e-3 failed for favor+ape)."""
    rows = [row for row in recipe_rows() if row["lr"] != 4e-3 or row["attention"] != "favor"]
    rows = [{**row, "final_val_acc": 0.99, "val_acc_draw_mean": 0.99} if row["lr"] == 4e-3 else row for row in rows]
    rows += [{**row, "final_val_acc": 0.99, "val_acc_draw_mean": 0.99} for row in recipe_rows()
             if row["lr"] == 4e-3 and row["attention"] == "favor"]
    rows += [{**row, "lr": 8e-3, "final_val_acc": 0.995} for row in recipe_rows()
             if row["lr"] == 4e-3 and row["attention"] == "softmax"]
    diverged = [(config_row(attention="favor", pe="ape", lr=8e-3, init="torch_default", grad_clip=1.0, seed=seed,
                            dataset="mnist", redraw_interval=10),
                 "rpevit.tasks.train.DivergedError: training loss is nan at epoch 2") for seed in range(2)]
    text = validation_choice.build(write_sweep(tmp_path / "recipe", "recipe", rows, failed=diverged))
    verdict = next(line for line in text.splitlines() if line.startswith("Validation chooses"))
    assert "Validation chooses 0.004, torch_default, 1 for every variant" in verdict
    assert "not bracketed" not in verdict
    assert ("0.008, torch_default, 1 was tried in every cell and cannot be chosen for every variant: it failed in "
            "mnist / favor / ape (2 of 2 seeds).") in verdict


def test_the_redraw_schedule_is_also_one_choice_for_every_encoding(tmp_path):
    """The redraw_val_cifar10 shape: per cell favor+ape prefers every step and favor+rope every 10 steps;
    one schedule for both (so that comparing the encodings does not also compare schedules) is the one
    with the highest mean over the two cells, every 10 steps (0.5817 against 0.5802 and 0.5578)."""
    val = {("ape", 1): [0.60, 0.601], ("ape", 10): [0.596, 0.5974], ("ape", 100): [0.578, 0.5796],
           ("rope", 1): [0.559, 0.5608], ("rope", 10): [0.566, 0.5674], ("rope", 100): [0.536, 0.5376]}
    rows = [{**config_row(attention="favor", pe=pe, redraw_interval=interval, redraw_until=0.8, seed=seed,
                          dataset="cifar10"),
             "test_acc": 0.5, "test_acc_draw_mean": 0.5, "final_val_acc": 0.1, "val_acc_draw_mean": value}
            for (pe, interval), values in val.items() for seed, value in enumerate(values)]
    text = validation_choice.build(write_sweep(tmp_path / "redraw", "redraw", rows))
    assert "- cifar10 / favor / ape: validation chooses 1, 0.8, not the earlier 100, 0.8" in text
    assert "- cifar10 / favor / rope: validation chooses 10, 0.8, not the earlier 100, 0.8" in text
    verdict = next(line for line in text.splitlines() if line.startswith("Validation chooses"))
    assert verdict.startswith("Validation chooses 10, 0.8 for every variant, not the earlier 100, 0.8")
    assert "not bracketed" not in verdict  # 10 lies between 1 and 100


def test_a_candidate_one_cell_has_not_tried_is_left_out_of_the_joint_choice_and_named(tmp_path):
    """A grid still running (luo_scale_val_cifar10 with relu at its first value): the joint choice is among the
    candidates every cell tried, and the verdict names each one left out and the cell that lacks it, so a partial
    grid never narrows the choice silently."""
    rows = recipe_rows()
    rows = [row for row in rows if not (row["attention"] == "favor" and row["init"] == "trunc_normal")]
    text = validation_choice.build(write_sweep(tmp_path / "recipe", "recipe", rows))
    verdict = next(line for line in text.splitlines() if line.startswith("Validation chooses"))
    assert verdict.startswith("Validation chooses 0.002, torch_default, 1.")  # (the earlier choice is left out)
    assert verdict.endswith("Not among the candidates, as some cell has not tried them: 0.002, trunc_normal, 1 "
                            "(mnist / favor / ape lacks it).")
    complete = validation_choice.build(write_sweep(tmp_path / "full", "full", recipe_rows()))
    assert "Not among the candidates" not in complete


def test_digits_redraw_is_judged_against_the_schedule_it_borrowed_from_mnist(tmp_path):
    """Issue 61: digits ran MNIST's validated schedule (every step until 80%), never chosen on digits; its own
    study is compared with that, and the text says where it came from (not "made on test")."""
    val = {1: [0.80, 0.81, 0.82], 10: [0.86, 0.87, 0.88], 100: [0.89, 0.90, 0.905]}
    rows = [{**config_row(attention="favor", pe="ape", redraw_interval=interval, redraw_until=0.8, seed=seed,
                          dataset="digits"),
             "test_acc": 0.5, "test_acc_draw_mean": 0.5, "final_val_acc": 0.1, "val_acc_draw_mean": value}
            for interval, values in val.items() for seed, value in enumerate(values)]
    text = validation_choice.build(write_sweep(tmp_path / "redraw", "redraw", rows))
    assert "the earlier choice (MNIST's validation choice, borrowed: never chosen on digits): 1, 0.8" in text
    assert "- digits / favor / ape: validation chooses 100, 0.8, not the earlier 1, 0.8" in text
    assert "(earlier choice)" in text


def test_a_knob_chosen_again_compares_with_the_first_studys_choice_and_supersedes_it_once_published(tmp_path):
    """luo_scale chosen again on digits at its validated recipe (validation_choice.RECHOSEN): the later study's
    earlier choice is the first study's 1000, not the 10 made on test; the first study stays published, and
    the dataset's default follows the later one only once the later one is published too."""
    from rpevit.analysis import answers_validation

    first, later = "luo_scale_val_digits", "luo_scale_val_digits_recipe"
    assert validation_choice.RECHOSEN[later]["supersedes"] == first
    again = [{**row, "luo_scale": {3.0: 1000.0, 10.0: 300.0}[row["luo_scale"]]} for row in rows()]
    text = validation_choice.build(write_sweep(tmp_path / later, later, again))
    assert "the earlier choice (luo_scale_val_digits' choice, made at digits' recipe before recipe_val_digits " \
           "chose it): 1000." in text
    softmax = next(line for line in text.splitlines() if line.startswith("- digits / softmax"))
    assert "validation chooses 1000, the earlier choice: it does not change." in softmax  # 1000 plays 3's part
    favor = next(line for line in text.splitlines() if line.startswith("- digits / favor"))
    assert "validation chooses 1000" in favor and "made on test" not in text
    # the same rows under another name: compared with the 10 made on test, which they never tried
    other = validation_choice.build(write_sweep(tmp_path / "luo_again", "luo_again", again))
    assert "the earlier choice (made on test): 10." in other

    write_sweep(tmp_path / first, first, rows())
    (tmp_path / ".gitignore").write_text(f"/*/\n!/{first}/\n")  # the later study not published: the first is current
    assert [f.name for f in answers_validation.current_validation_folders(tmp_path)] == [first]
    assert answers_validation.superseded_by(tmp_path, tmp_path / first) is None
    (tmp_path / ".gitignore").write_text(f"/*/\n!/{first}/\n!/{later}/\n")
    assert [f.name for f in answers_validation.current_validation_folders(tmp_path)] == [later]
    assert [f.name for f in answers_validation.validation_folders(tmp_path)] == [first, later]  # both stay published
    assert answers_validation.superseded_by(tmp_path, tmp_path / first) == later


def test_an_earlier_choice_that_failed_on_every_seed_is_said_so_not_called_unresolved(tmp_path):
    """favor's earlier 10 diverges on every seed (luo_scale_val_digits_recipe: favor at 1000): there is no margin
    to judge, and the line says why instead of "not resolved with 3 and 0 seeds"."""
    from rpevit.analysis import answers_validation

    kept = [r for r in rows() if not (r["attention"] == "favor" and r["luo_scale"] == 10.0)]
    diverged = [(config_row(attention="favor", pe="luo_rpe", luo_scale=10.0, seed=seed, dataset="digits",
                            redraw_interval=100), "rpevit.tasks.train.DivergedError: training loss is nan at epoch 4")
                for seed in range(3)]
    folder = write_sweep(tmp_path / "luo", "luo", kept, failed=diverged)
    favor = next(line for line in answers_validation.validation_lines(folder) if line.startswith("digits / favor"))
    assert favor == "digits / favor / luo_rpe: validation chooses luo_scale = 3 over the earlier 10, which failed in " \
                    "3 of 3 seeds: no margin; the smallest value tried, so not bracketed"  # 3 of {3, 10}
    short = next(line for line in answers_validation.validation_lines(folder, short=True)
                 if line.startswith("digits / favor"))
    assert short == "digits / favor / luo_rpe: 3 over 10, which failed in 3 of 3 seeds: no margin; the smallest " \
                    "value tried, so not bracketed" \
        and "not resolved" not in short
    assert answers_validation.possessive("digits") == "digits'" and answers_validation.possessive("mnist") == "mnist's"


def paired_rows(chosen_seeds=(0, 1, 2)) -> list[dict]:
    """Two cells, two recipes, a large seed effect (0.80 / 0.86 / 0.92) shared by both recipes and a small,
    steady gain of the new recipe on every seed: paired by seed the gain is plain, unpaired the seed spread
    hides it. The chosen recipe's rows come in the reverse seed order in one cell (pairing is by seed id,
    not by row position)."""
    base = {0: 0.80, 1: 0.86, 2: 0.92, 3: 0.80, 4: 0.86, 5: 0.92}
    gain = {("softmax", "rope"): (0.010, 0.012, 0.011), ("favor", "ape"): (0.006, 0.005, 0.007)}
    out = []
    for (attention, pe), steps in gain.items():
        for init, seeds in (("trunc_normal", (0, 1, 2)), ("torch_default", chosen_seeds)):
            order = seeds[::-1] if attention == "favor" and init == "torch_default" else seeds
            for seed in order:
                val = base[seed] + (steps[seed % 3] if init == "torch_default" else 0.0)
                out.append({**config_row(attention=attention, pe=pe, lr=2e-3, init=init, grad_clip=1.0, seed=seed,
                                         dataset="mnist", redraw_interval=10 if attention == "favor" else 0),
                            "test_acc": 0.5, "test_acc_draw_mean": 0.5, "final_val_acc": val, "val_acc_draw_mean": val})
    return out


def joint_verdict(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("Validation chooses"))


def test_the_joint_margin_is_paired_by_seed_and_exploratory(tmp_path):
    """The joint choice and the earlier one ran the same seeds in every cell: its margin is the one-sample t
    interval of the per-seed differences of the cell means (n = seeds), not Welch; and since the chosen one is
    the best of the candidates tried (a selection), it is exploratory: "excludes 0", never "resolved"."""
    verdict = joint_verdict(validation_choice.build(write_sweep(tmp_path / "recipe", "recipe", paired_rows())))
    diffs = [(0.010 + 0.006) / 2, (0.012 + 0.005) / 2, (0.011 + 0.007) / 2]  # per seed, mean over the two cells
    paired = stats.mean_interval(diffs)
    assert paired.excludes(0.0) and not stats.welch([0.8 + d for d in diffs], [0.8, 0.86, 0.92]).excludes(0.0)
    assert (f"its margin on validation (mean over cells) is {paired.text(100, 3)} points (paired by seed; exploratory: "
            f"0.002, torch_default, 1 was picked as the best of 2 candidates): its 95% interval excludes 0.") in verdict
    assert "(n=3)" in verdict and "n=3,3" not in verdict and "resolved" not in verdict


def test_the_joint_margin_falls_back_to_welch_where_the_seeds_differ_and_says_why(tmp_path):
    verdict = joint_verdict(validation_choice.build(write_sweep(tmp_path / "recipe", "recipe",
                                                                paired_rows(chosen_seeds=(3, 4, 5)))))
    diffs = [(0.010 + 0.006) / 2, (0.012 + 0.005) / 2, (0.011 + 0.007) / 2]
    welch = stats.welch([b + d for b, d in zip([0.80, 0.86, 0.92], diffs)], [0.80, 0.86, 0.92])
    assert (f"is {welch.text(100, 3)} points (Welch, unpaired: the two ran different seeds: 3, 4, 5 and 0, 1, 2; "
            f"exploratory: 0.002, torch_default, 1 was picked as the best of 2 candidates): its 95% interval does not "
            f"exclude 0.") in verdict


def test_the_joint_choice_is_called_the_setting_used_only_where_a_published_study_ran_it(tmp_path):
    """ANSWERS.md labelled every joint choice "(the setting used)", digits' too, beside "no published study ran
    digits with it": the label now says which, from the rows (the dataset's default, the validation study itself
    not counted), and "the setting used" once a study ran it on the dataset."""
    from rpevit.analysis import answers_validation

    folder = write_sweep(tmp_path / "recipe_val_mnist", "recipe_val_mnist", recipe_rows())
    joint = answers_validation.validation_lines(folder)[-1]
    assert joint.startswith("every variant alike (mnist's default, which no published study has run): 0.002, "
                            "torch_default, 1 for every variant") and "the setting used" not in joint
    study = {**config_row(attention="softmax", pe="ape", dataset="mnist", seed=0), "test_acc": 0.9,
             "final_val_acc": 0.9, "val_acc_draw_mean": float("nan"), "test_acc_draw_mean": float("nan")}
    write_sweep(tmp_path / "other", "other", [{**study, "lr": 2e-3, "init": "trunc_normal", "grad_clip": 1.0},
                                              {**study, "dataset": "cifar10", "lr": 2e-3, "init": "torch_default"}])
    # the earlier recipe, or another dataset
    assert "the setting used" not in answers_validation.validation_lines(folder)[-1]
    write_sweep(tmp_path / "study", "study", [{**study, "lr": 2e-3, "init": "torch_default", "grad_clip": 1.0}])
    assert answers_validation.validation_lines(folder, short=True)[-1].startswith(
        "every variant alike (the setting used): 0.002, torch_default, 1")


# seed -> validation accuracy: a large seed effect (0.78 to 0.92) shared by both candidates and a small, steady
# gain of 3 over 10 on each seed. softmax's 3 failed in seed 3 (only seeds 0-2 pair); favor's 3 ran other seeds.
SEEDED_VAL = {("softmax", 10.0): {0: 0.80, 1: 0.86, 2: 0.92, 3: 0.78}, ("softmax", 3.0): {0: 0.81, 1: 0.872, 2: 0.931},
              ("favor", 10.0): {0: 0.80, 1: 0.86, 2: 0.92}, ("favor", 3.0): {10: 0.81, 11: 0.872, 12: 0.931}}


def seeded_study(tmp_path):
    diverged = [(config_row(attention="softmax", pe="luo_rpe", luo_scale=3.0, seed=3, dataset="digits"),
                 "rpevit.tasks.train.DivergedError: training loss is nan at epoch 2")]
    return write_sweep(tmp_path / "luo", "luo", rows(SEEDED_VAL), failed=diverged)


def t_interval_by_hand(diffs: list[float], level: float) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean difference +- the t quantile with n - 1 df times sd / sqrt(n)."""
    n, mean = len(diffs), sum(diffs) / len(diffs)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    half = scipy_stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def test_a_cells_margin_is_paired_by_seed_over_the_seeds_both_candidates_have(tmp_path):
    """The candidates of a cell ran the same seeds: softmax's margin is the one-sample t interval of the per-seed
    differences over the 3 seeds both have (seed 3, where 3 failed, left out; n = 3 pairs), which excludes 0,
    where Welch (whose seed spread hides the steady gain, and which compares 3 seeds with 4) does not. Holm over
    the 2 cells: the paired one has the smaller p, so it is shown at 97.5%. favor's two candidates share no seed:
    Welch, and its line says so."""
    folder = seeded_study(tmp_path)
    frame = load_trials(folder, task="train")
    _, records = validation_choice.choices(frame[frame["status"] == "ok"], validation_choice.failed_trials(folder))
    judged = validation_choice.margins(records)
    softmax, favor = judged["digits / softmax / luo_rpe"], judged["digits / favor / luo_rpe"]
    chosen, earlier = SEEDED_VAL[("softmax", 3.0)], SEEDED_VAL[("softmax", 10.0)]
    diffs = [chosen[seed] - earlier[seed] for seed in (0, 1, 2)]
    for interval, level in ((softmax.nominal, 0.95), (softmax.interval, 1 - 0.05 / 2)):
        assert np.allclose((interval.point, interval.lo, interval.hi), t_interval_by_hand(diffs, level), rtol=1e-9)
        assert interval.n == (3,) and interval.df == 2
    assert softmax.nominal.excludes(0.0) and softmax.resolved and softmax.k == 2
    assert not stats.welch(list(chosen.values()), list(earlier.values())).excludes(0.0)
    assert not stats.welch(list(chosen.values()), [earlier[seed] for seed in (0, 1, 2)]).excludes(0.0)
    welch = stats.welch(list(SEEDED_VAL[("favor", 3.0)].values()), list(SEEDED_VAL[("favor", 10.0)].values()))
    assert favor.nominal == welch and not favor.resolved

    text = validation_choice.build(folder)
    line = next(line for line in text.splitlines() if line.startswith("- digits / softmax"))
    assert (f"its margin on validation is {softmax.nominal.text(100, 3)} points (paired by seed over the seeds both "
            f"have: seed 3 left out, where one of the two has no value), Holm over 2 cell(s): better on validation "
            f"than the earlier choice.") in line and "(n=3)" in line
    line = next(line for line in text.splitlines() if line.startswith("- digits / favor"))
    assert (f"its margin on validation is {welch.text(100, 3)} points (Welch, unpaired: the two ran different seeds: "
            f"10, 11, 12 and 0, 1, 2), Holm over 2 cell(s): not resolved with 3 seeds.") in line


def test_a_margin_over_all_seeds_alike_says_paired_by_seed(tmp_path):
    """The usual case: both candidates have a value on every seed; the line says "paired by seed", n = seeds."""
    text = validation_choice.build(write_sweep(tmp_path / "luo", "luo", rows()))
    softmax = next(line for line in text.splitlines() if line.startswith("- digits / softmax"))
    diffs = [a - b for a, b in zip(VAL[("softmax", 3.0)], VAL[("softmax", 10.0)])]
    assert f"its margin on validation is {stats.mean_interval(diffs).text(100, 3)} points (paired by seed)," in softmax
