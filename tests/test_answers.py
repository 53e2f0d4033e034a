"""Numbers that cannot drift (issue 41): the answers in README.md, results/README.md, results/ANSWERS.md and
docs/ are written by rpevit.analysis.answers from the committed Parquet, and these tests fail when the
committed text and the regenerated text differ, when a typed count disagrees with the Parquet, or when the
wording claims more than the interval at its Holm level shows."""
from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest

from rpevit.analysis import (answers, answers_blocks, answers_cost, answers_sources, answers_validation,
                             answers_wording, confirmatory, gap_closure, stats, token_scaling)
from rpevit.analysis.common import fmt
from rpevit.sweep.results import LinkRefused
from rpevit.analysis.generated import GeneratedTextError, block_names, fill, stale, whole_file, write_atomic
from rpevit.sweep import declaration
from rpevit.sweep.declaration import parse
from tests.analysis_rows import config_row, write_sweep
from tests.test_declaration import DECLARE, rows

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


# ---------------------------------------------------------------- the committed text
@pytest.mark.slow
def test_committed_answers_equal_what_the_analysis_code_writes():
    """Every generated file and block, regenerated from the committed Parquet, equals the committed text."""
    messages = stale(answers.expected_texts(RESULTS), ROOT)
    assert not messages, "\n\n".join(messages) + f"\n\nRegenerate with: {answers.COMMAND}"


@pytest.mark.slow
def test_typed_counts_in_the_provenance_table_match_the_parquet():
    messages = answers_blocks.provenance_mismatches(RESULTS)
    assert not messages, "\n".join(messages)


def test_the_readme_answers_hold_no_hand_typed_figure():
    """The README's "Answers so far" has its figures only inside the generated block: a decimal or an
    interval typed outside it is the drift issue 41 found (a 3-seed subset quoted after report.md had 5)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Answers so far", 1)[1].split("\n## ", 1)[0]
    assert "answers" in block_names(section)
    outside = re.sub(r"<!-- BEGIN GENERATED answers.*?<!-- END GENERATED answers -->", "", section, flags=re.S)
    typed = re.findall(r"\d+\.\d+|\[\s*[-−]?[\d.]+,", outside)
    assert not typed, f"figures typed by hand in README's answers: {typed}; put them in rpevit/analysis/answers.py"


# ---------------------------------------------------------------- generated blocks
def body(name: str) -> str:
    return f"text of {name}"


def test_fill_rewrites_each_block_and_leaves_the_rest():
    text = "intro\n<!-- BEGIN GENERATED a -->\nstale\n<!-- END GENERATED a -->\nmiddle 1.5\n" \
           "<!-- BEGIN GENERATED b: old command -->\n<!-- END GENERATED b -->\nend\n"
    out = fill(text, {"a": lambda: body("a"), "b": lambda: body("b")}, "cmd", "x.md")
    assert "stale" not in out and "text of a" in out and "text of b" in out
    assert out.startswith("intro\n") and "middle 1.5\n" in out and out.endswith("end\n")
    assert out.count("`cmd` rewrites this block") == 2 and block_names(out) == ["a", "b"]
    assert fill(out, {"a": lambda: body("a"), "b": lambda: body("b")}, "cmd", "x.md") == out  # a fixed point


@pytest.mark.parametrize("text, match", [
    ("<!-- BEGIN GENERATED a -->\nx\n", "no matching"),
    ("<!-- BEGIN GENERATED a -->\n<!-- BEGIN GENERATED b -->\n<!-- END GENERATED b -->\n<!-- END GENERATED a -->",
     "no matching|starts inside"),
    ("<!-- BEGIN GENERATED zz -->\n<!-- END GENERATED zz -->", "has no generator"),
    ("x\n<!-- END GENERATED a -->\n", "closes no block"),
])
def test_bad_markers_are_refused_in_one_line(text, match):
    with pytest.raises(GeneratedTextError, match=match):
        fill(text, {"a": lambda: "", "b": lambda: ""}, "cmd", "x.md")


def test_stale_names_the_file_and_shows_the_difference(tmp_path):
    path = tmp_path / "f.md"
    path.write_text("one\ntwo\n")
    assert stale({path: "one\ntwo\n"}, tmp_path) == []
    (message,) = stale({path: "one\nthree\n"}, tmp_path)
    assert message.startswith("f.md differs") and "-two" in message and "+three" in message
    assert whole_file("body", "cmd").startswith("<!-- GENERATED FILE: `cmd`")


def test_writes_never_follow_a_symbolic_link(tmp_path):
    target = tmp_path / "target.md"
    target.write_text("keep")
    link = tmp_path / "link.md"
    link.symlink_to(target)
    with pytest.raises(LinkRefused, match="symbolic link"):
        write_atomic(link, "overwritten")
    assert target.read_text() == "keep"


# ---------------------------------------------------------------- wording: no more than the Holm interval shows
CONFIG = ("d", "favor", "none", "every 100")


def measured(soft: list[float], base: list[float], pe: list[float], soft_pe: list[float]) -> gap_closure.Assessment:
    acc = {("d", "softmax", "ape", "none", "off"): np.array(soft), ("d", "favor", "ape", "none", "every 100"):
           np.array(base), ("d", "favor", "rope", "none", "every 100"): np.array(pe),
           ("d", "softmax", "rope", "none", "off"): np.array(soft_pe)}
    return gap_closure.measure(acc, CONFIG, ["rope"])


def test_no_G_is_quoted_where_the_gap_is_not_resolved():
    """CIFAR-10's "favor+luo_rpe matches softmax+ape (G 1.01 ...)" quoted a G the rule leaves undefined."""
    a = measured([0.90, 0.97, 0.83], [0.880, 0.882, 0.884], [0.970, 0.971, 0.972], [0.975, 0.976, 0.977])
    assert a.gap.state == "not resolved" and a.closures["rope"].effect == "raises"
    sentence = answers_wording.encoding_sentence("rope", a.closures["rope"], a.gap, "favor")
    assert "G " not in sentence and sentence.startswith("rope: raises favor+ape")
    assert "so G is not defined" in answers_wording.gap_sentence(a.gap, "favor", "draw mean")


def test_G_is_quoted_where_the_gap_is_resolved():
    a = measured([0.950, 0.951, 0.952], [0.800, 0.801, 0.802], [0.870, 0.871, 0.872], [0.960, 0.961, 0.962])
    assert a.gap.state == "resolved"
    sentence = answers_wording.encoding_sentence("rope", a.closures["rope"], a.gap, "favor")
    assert "narrows the gap (not fully: G below 1 at its Holm level)" in sentence and "G 0.467" in sentence and "at its Holm level" in sentence


def test_an_unresolved_effect_is_never_worded_as_one():
    """results/README.md once said "luo_rpe raises relu+ape" of an effect its Holm interval did not resolve."""
    a = measured([0.90, 0.95, 0.85], [0.89, 0.84, 0.92], [0.90, 0.86, 0.93], [0.91, 0.95, 0.86])
    sentence = answers_wording.encoding_sentence("rope", a.closures["rope"], a.gap, "favor")
    assert "not resolved with 3" in sentence and not re.search(r"\b(raises|lowers|widens|closes)\b", sentence)
    assert "not resolved: rope (n=3,3)" in answers.grouped_effects(a, "favor")


# ---------------------------------------------------------------- confirmatory or exploratory
def study(results: Path, name: str, declared: bool) -> Path:
    folder = results / name
    folder.mkdir(parents=True)
    if declared:
        declaration.record(folder, parse(DECLARE, "x"), rows_exist=False, redeclare=False)
    write_sweep(folder, name, rows(time.time() + 10))
    return folder


def test_without_a_declared_study_every_answer_is_exploratory(tmp_path):
    study(tmp_path / "results", "old", declared=False)
    sources = answers_sources.Sources(tmp_path / "results")
    (line,) = answers.declared_section(sources, detail=True)
    assert line.startswith("No published study declared its comparisons")
    assert "`old` declared no comparisons" in answers_wording.exploratory(["old"], sources.results_dir)
    assert confirmatory.exploratory_note([tmp_path / "results" / "old"]).startswith("_Exploratory: no study")


def test_a_declared_study_gets_its_confirmatory_section_when_it_lands(tmp_path):
    """The MNIST rerun and the CIFAR-10 ladder will land with a declaration.json: the answers pick each up."""
    results = tmp_path / "results"
    study(results, "headline", declared=True)
    text = "\n".join(answers.declared_section(answers_sources.Sources(results), detail=True))
    assert "`headline` (confirmatory" in text
    assert "`headline` (confirmatory): " in text and "n = 3 declared seeds per cell" in text
    assert "  - gap, k = 2: resolved: softmax+ape − favor+ape 10 [" in text  # one line per family
    assert "; not resolved with 3 seeds: softmax+rope − favor+rope." in text
    assert "resolved: attention=softmax pe=ape higher" in text  # the verdict column of its table
    assert "### `headline`: its confirmatory table" in text and "Rows set aside: 2 (a seed outside" in text


def test_a_family_is_one_line_grouped_by_verdict_and_an_incomplete_pair_gets_none():
    """The README names 27 (MNIST) and 33 (ladder) declared comparisons: one line per family, resolved pairs
    with their Holm interval, the others by name, an incomplete pair with its seed counts and no figure."""
    def outcome(a: dict, b: dict, va, vb, complete=True) -> confirmatory.Outcome:
        iv = stats.welch(np.array(va), np.array(vb), 0.975)
        return confirmatory.Outcome("f", "", "", tuple(va), tuple(vb), iv, iv, 3, complete,
                                    confirmatory.short_label(a), confirmatory.short_label(b))
    soft, favor = {"attention": "softmax", "pe": "rope"}, {"attention": "favor", "pe": "rope", "epochs": 5}
    line = answers.family_line("the gap", [
        outcome(soft, favor, [90.0, 90.1, 90.2], [80.0, 80.1, 80.2]),
        outcome({"pe": "ape"}, {"pe": "rope"}, [90.0, 95.0, 85.0], [89.0, 94.0, 86.0]),
        outcome({"pe": "ape"}, {"pe": "luo_rpe"}, [90.0, 95.0, 85.0], [89.0, 94.0], complete=False)], 3)
    assert line.startswith("  - the gap, k = 3: resolved: softmax+rope − favor+rope epochs=5 10 [")
    assert "; not resolved with 3 seeds: ape − rope; " in line
    assert line.endswith("incomplete, no verdict before the declared n: ape − luo_rpe (3 and 2 of 3 seeds).")


def test_a_contrast_family_line_says_which_way_each_resolved_item_goes():
    """A publication rehearsal: 'resolved: (softmax+ape − favor+ape) − (softmax+rope − favor+rope) -2.97 ...'
    beside a positive one lumped a widening with a narrowing under one word; each now says which way it goes."""
    def contrast(point: float, gap_2: float) -> confirmatory.Outcome:
        iv = stats.Interval(point, point - 1, point + 1, n=(5, 5, 5, 5), level=0.975, p=0.001)
        gaps = (stats.Interval(2.0, 1.0, 3.0, n=(5, 5)), stats.Interval(gap_2, gap_2 - 1, gap_2 + 1, n=(5, 5)))
        return confirmatory.Outcome("f", "", "", (), (), iv, iv, 2, True, "softmax+ape − favor+ape",
                                    "softmax+rope − favor+rope", kind="contrast", gaps=gaps)
    line = answers.family_line("narrowing", [contrast(1.5, 0.5), contrast(-3.0, 5.0)], 5)
    assert "(softmax+ape − favor+ape) − (softmax+rope − favor+rope) 1.5 [0.5, 2.5] (n=5,5,5,5; 97.5%) (gap 2 " \
           "smaller)" in line
    assert "-3 [-4, -2] (n=5,5,5,5; 97.5%) (gap 2 larger)" in line
    assert "(gap 2 smaller, below 0)" in answers.family_line("narrowing", [contrast(2.5, -0.5)], 5)


def test_a_study_both_running_and_published_is_refused_in_one_line(tmp_path):
    """A partial-publication rehearsal: following the kept RESUME.md of a published study copied its rows back into
    results/in_progress/, and the answers listed it as both published and running, with no error."""
    results = tmp_path / "results"
    study(results, "headline", declared=True)
    study(results / answers_sources.IN_PROGRESS, "headline", declared=True)
    with pytest.raises(answers_sources.AnswersError,
                       match="both hold the declared study 'headline'; allowed: one of them"):
        answers.running_lines(results)


def test_a_declared_study_still_running_gets_one_line_and_no_verdict(tmp_path):
    """results/in_progress/<study>/ holds a running study's rows so far (committed at each stop): its
    declared comparisons are not judged, and the README's front door gets one line, not one per pair."""
    results = tmp_path / "results"
    study(results / answers_sources.IN_PROGRESS, "headline", declared=True)
    assert answers_sources.confirmatory_studies(results) == []
    assert answers_sources.confirmatory_studies(results, running=True) == [
        results / answers_sources.IN_PROGRESS / "headline"]
    lines = answers.declared_section(answers_sources.Sources(results), detail=True)
    assert lines[0].startswith("No published study declared its comparisons")
    (running,) = [line for line in lines if "in_progress/headline" in line]
    assert running.startswith("- Running, declared before its first trial:")
    # its items complete so far are judged in its own confirmatory.md, and the line says how many and where
    decl, _, families, _ = confirmatory.judge(results / answers_sources.IN_PROGRESS / "headline")
    complete = sum(o.complete for _, outcomes in families for o in outcomes)
    assert complete == 2 and "2 of the 2 are judged so far, in `in_progress/headline/confirmatory.md`" in running
    assert not any(line.startswith("  - ") or "resolved" in line for line in lines)  # no comparison lines


def test_a_running_study_line_counts_only_the_items_whose_cells_are_complete(tmp_path):
    results = tmp_path / "results"
    folder = results / answers_sources.IN_PROGRESS / "ladder"
    folder.mkdir(parents=True)
    declaration.record(folder, parse(DECLARE, "x"), rows_exist=False, redeclare=False)
    write_sweep(folder, "ladder", [r for r in rows(time.time() + 10) if (r["pe"], r["seed"]) != ("rope", 2)])
    (line,) = answers.running_lines(results)
    assert "1 of the 2 are judged so far" in line  # softmax+ape − favor+ape complete, the rope pair short of seed 2


def test_every_exploratory_line_a_declared_study_answers_ends_with_its_declared_counts(tmp_path):
    """A review found exploratory lines (the gains, the same-encoding gaps, ReLU) contradicted by declared studies
    with no note: only softmax+ape − favor+ape was looked up. declared_brief counts each declared pair's verdicts
    per family; a pair no declared study names is left out, and so is a study of another dataset."""
    results = tmp_path / "results"
    study(results, "headline", declared=True)
    sources = answers_sources.Sources(results)
    decl, _, families, _ = confirmatory.judge(results / "headline")
    (name, (ape, rope)), = families
    assert ape.resolved and ape.holm.point > 0 and rope.complete  # the rows of tests.test_declaration
    rope_word = ("softmax+rope ahead" if rope.resolved and rope.holm.point > 0 else "favor+rope ahead"
                 if rope.resolved else "not resolved")
    brief = answers.declared_brief(sources, "digits", [("softmax+ape", "favor+ape"), ("softmax+rope", "favor+rope"),
                                                       ("favor+rope", "favor+ape")])
    assert brief == ("`headline`: softmax+ape − favor+ape: softmax+ape ahead in 1 of 1 declared family; "
                     f"softmax+rope − favor+rope: {rope_word} in 1 of 1 declared family")
    assert answers.declared_brief(sources, "mnist", [("softmax+ape", "favor+ape")]) == ""
    assert answers.declared_brief(sources, "digits", [("favor+rope", "favor+ape")]) == ""
    # a pair asked the other way round than declared: the same counts, the word still names the variant ahead
    assert answers.declared_brief(sources, "digits", [("favor+ape", "softmax+ape")]) == (
        "`headline`: favor+ape − softmax+ape: softmax+ape ahead in 1 of 1 declared family")


def test_the_published_exploratory_lines_carry_the_declared_counts_where_a_declared_study_answers():
    text = (RESULTS / answers.ANSWERS_FILE).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.startswith(("  - On favor+ape (gain)", "  - Same encoding",
                                                                    "  - ReLU"))]
    assert len(lines) == 6 and all("declared famil" in line for line in lines)


def test_a_published_declared_ladder_gets_its_ranking_line_labelled_exploratory(tmp_path):
    from tests.test_analysis_budget_ladder import rows as ladder_rows
    results = tmp_path / "results"
    folder = results / "ladder"
    folder.mkdir(parents=True)
    declaration.record(folder, parse(DECLARE, "x"), rows_exist=False, redeclare=False)
    write_sweep(folder, "ladder", [{**r, "started_at": time.time() + 10} for r in ladder_rows()])
    (line,) = answers.ladder_lines(answers_sources.Sources(results))
    assert line.startswith("- Budget ladder (`ladder`; exploratory, beside its declared comparisons): Kendall's tau")
    assert "5 → 20 epochs 0.667 [" in line and line.endswith("(`python analysis/budget_ladder.py results/ladder`).")
    assert answers.ladder_section(answers_sources.Sources(results))[0] == "## Budget ladders (exploratory)"
    study(results, "headline", declared=True)  # one budget: not a ladder
    assert len(answers.ladder_lines(answers_sources.Sources(results))) == 1


def test_a_declared_question_and_family_name_reach_markdown_inert(tmp_path):
    """The question and family names come from a file (the space's declare: block, then declaration.json):
    no link (a bare URL's autolink included), image, HTML or code span may open in the README, ANSWERS.md or
    confirmatory.md."""
    results = tmp_path / "results"
    folder = results / "headline"
    folder.mkdir(parents=True)
    hostile = {**DECLARE, "question": "<img src=x onerror=alert(1)> [click](http://e.example) `x`",
               "families": [{**DECLARE["families"][0], "name": "gap ![i](http://e.example/i.png) <b>"}]}
    declaration.record(folder, parse(hostile, "x"), rows_exist=False, redeclare=False)
    write_sweep(folder, "headline", rows(time.time() + 10))
    text = "\n".join(answers.declared_section(answers_sources.Sources(results), detail=True))
    assert "&lt;img src=x onerror=alert(1)&gt; \\[click\\](http\\://e.example) \\`x\\`" in text
    assert "  - gap !\\[i\\](http\\://e.example/i.png) &lt;b&gt;, k = 2: resolved" in text
    assert "<img" not in text and "<b>" not in text and "[click]" not in text and "![i]" not in text


def test_results_readme_says_which_studies_are_confirmatory_from_their_declarations(tmp_path):
    """results/README.md said "None of the studies here declared ..." by hand: true until the MNIST rerun
    lands, then stale. The sentence is generated from the declaration.json files."""
    results = tmp_path / "results"
    study(results, "old", declared=False)
    study(results / answers_sources.IN_PROGRESS, "ladder", declared=True)
    text = answers_blocks.declared_studies_block(answers_sources.Sources(results))
    assert text.startswith("None of the studies here declared") and text.endswith(": `in_progress/ladder`.")
    study(results, "headline", declared=True)
    text = answers_blocks.declared_studies_block(answers_sources.Sources(results))
    assert text.startswith("Declared its comparisons before it ran, so confirmatory") and ": `headline`. " in text
    assert "None of" not in text and "`old`" not in text and "Running, declared" in text


def test_only_declared_studies_are_labelled_confirmatory(tmp_path):
    results = tmp_path / "results"
    for name, declared in (("old", False), ("headline", True)):
        (results / name).mkdir(parents=True)
        (results / name / "trials.parquet").write_bytes(b"")  # confirmatory_studies looks for the file only
        if declared:
            declaration.record(results / name, parse(DECLARE, "x"), rows_exist=False, redeclare=False)
    assert answers_sources.confirmatory_studies(results) == [results / "headline"]
    label = answers_wording.exploratory(["headline", "old"], results)
    assert "`old` declared no comparisons" in label and "declared comparisons of `headline`" in label
    assert "Declared before their runs: headline" in confirmatory.exploratory_note([results / "headline"])


def test_a_typed_count_that_disagrees_with_the_parquet_is_named(tmp_path):
    results = tmp_path / "results"
    write_sweep(results / "s", "s", [config_row(dataset="digits", seed=seed) | {"test_acc": 0.5} for seed in (0, 1)])
    readme = results / "README.md"
    readme.write_text("| folder | what |\n|---|---|\n| `s/` | 2 ok, 0 failed |\n")
    assert answers_blocks.provenance_mismatches(results) == []
    readme.write_text("| folder | what |\n|---|---|\n| `s/` | 3 ok, 0 failed |\n")
    (message,) = answers_blocks.provenance_mismatches(results)
    assert "`s/` says '3 ok', but its Parquet holds 2 ok" in message


def test_studies_still_running_stay_out_of_the_provenance_table(tmp_path):
    """results/in_progress/<study>/ holds rows committed at each stop of a study still running: they change at
    every stop and are not published, so the generated provenance table (results/README.md) leaves them out
    while a published folder one level down (results/pilots/<sweep>/) stays in."""
    results = tmp_path / "results"
    row = config_row(dataset="digits", seed=0) | {"test_acc": 0.5}
    write_sweep(results / "in_progress" / "running", "running", [row])
    write_sweep(results / "pilots" / "done", "done", [row])
    assert [r["folder"] for r in answers_blocks.folder_rows(results)] == ["pilots/done"]


def test_a_folder_name_reaches_the_provenance_table_inert(tmp_path):
    """An audit: the provenance table (results/README.md) printed each folder name raw, and a published parent
    (gpu_h100) admits any name one level down: `x<img src=x onerror=alert(1)>` came out as HTML."""
    results = tmp_path / "results"
    row = config_row(dataset="digits", seed=0) | {"test_acc": 0.5}
    write_sweep(results / "pilots" / "x<img src=x>[l](https:", "s", [row])
    table = answers_blocks.rows_block(answers_sources.Sources(results))
    span = "`pilots/x<img src=x>[l](https:`"  # inside a code span nothing is markup or HTML
    assert span in table and "<img" not in table.replace(span, "")


def test_a_knob_field_the_published_rows_predate_is_read_as_its_default_and_said_so():
    """The published studies' rows were written before `init` existed (a KeyError before the fix): their code had
    only trunc_normal, the field's default; the sentence names the field as not recorded."""
    import pandas as pd

    frame = pd.DataFrame({"lr": [1e-3, 2e-3, 2e-3], "grad_clip": [1.0, 1.0, 1.0]})
    filled, unrecorded = answers_validation.with_defaults_for_unrecorded(frame, ("lr", "init", "grad_clip"))
    assert unrecorded == ["init"] and set(filled["init"]) == {"trunc_normal"} and "init" not in frame
    partly = frame.assign(init=["torch_default", None, None])
    filled, unrecorded = answers_validation.with_defaults_for_unrecorded(partly, ("lr", "init", "grad_clip"))
    assert unrecorded == ["init"] and list(filled["init"]) == ["torch_default", "trunc_normal", "trunc_normal"]
    assert answers_validation.with_defaults_for_unrecorded(partly.fillna("x"), ("lr", "init"))[1] == []


def test_an_exploratory_line_superseded_names_the_settings_that_differ():
    """A reviewer read "superseded by the declared studies' confirmatory answer to the same comparison" as the
    same runs; the line now names every protocol setting the declared rows ran differently (older rows read at
    what their code ran), and only the exploratory configuration it supersedes (one redraw schedule)."""
    import pandas as pd

    base = {"attention": "favor", "pe": "ape", "qk_norm": "none", "epochs": 7, "n_train": 50000.0, "lr": 2e-3,
            "warmup_epochs": 0.7, "grad_clip": 1.0, "redraw_interval": 100, "redraw_until": 0.8,
            "torch_version": "2.15.0"}
    before = pd.DataFrame([base, {**base, "attention": "softmax"}, {**base, "redraw_interval": 0},
                           {**base, "qk_norm": "l2", "lr": 9.0}])
    after = pd.DataFrame([{**base, "n_train": 50000, "lr": 4e-3, "init": "torch_default", "lr_schedule": "wsd",
                           "redraw_interval": 10, "torch_version": "2.14.1"},
                          {**base, "attention": "softmax", "n_train": 50000, "lr": 4e-3, "init": "torch_default",
                           "lr_schedule": "wsd", "torch_version": "2.14.1"}])
    rows = answers.cell_rows(before, ("softmax+ape", "favor+ape"))
    assert len(rows) == 3  # qk_norm l2 is another configuration
    text = answers.protocol_differences(rows, answers.cell_rows(after, ("softmax+ape", "favor+ape")),
                                        "every 100 until 0.8")
    assert text == ("lr_schedule cosine → wsd, lr 0.002 → 0.004, init trunc_normal → torch_default, "
                    "redraw_interval 100 → 10, torch_version 2.15.0 → 2.14.1")  # n_train: 50000 both, int or float
    one_schedule = rows[rows["redraw_interval"] == 100]
    assert answers.protocol_differences(rows, one_schedule, "every 100 until 0.8") == ""


def test_the_published_superseded_lines_name_what_differs():
    text = (Path(__file__).resolve().parents[1] / "results" / answers.ANSWERS_FILE).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if "superseded by the declared studies" in line]
    assert lines and all("not a rerun of these trials" in line and "settings that differ from these rows: " in line
                         for line in lines)


def test_every_resolved_same_encoding_gap_is_said_on_both_accuracies():
    """Each configuration's Holm family holds a same-encoding gap per encoding on each accuracy; a reviewer found
    resolved training-draw gaps (cifar10_cpu, circulant_string under FAVOR+) never shown. Every resolved one
    reaches the configuration's lines with its figures."""
    sources = answers_sources.Sources(Path(__file__).resolve().parents[1] / "results")
    checked = 0
    for config in sources.assessed[gap_closure.DRAW_MEAN]:
        text = "\n".join(answers_wording.configuration_lines(sources, config))
        for metric in (gap_closure.DRAW_MEAN, gap_closure.TRAIN_DRAW):
            for pe, c in sources.assessed[metric][config].closures.items():
                if c.same_holm is not None and c.same_holm.resolved:
                    checked += 1
                    assert f"softmax+{pe} − {config[1]}+{pe} {answers_wording.claim(c.same_holm)}" in text, (
                        config, metric, pe)
    assert checked


def test_the_published_answers_never_skip_a_heading_level():
    """A reader's outline (and a Markdown linter) breaks where ## is followed by ####: a reviewer found the
    declared studies' tables one level too deep."""
    root = Path(__file__).resolve().parents[1]
    for name in (answers.ANSWERS_FILE, "README.md"):
        text = (root / "results" / name).read_text(encoding="utf-8")
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        levels = [len(m.group(1)) for m in re.finditer(r"^(#{1,6}) ", text, re.M)]
        jumps = [(a, b) for a, b in zip(levels, levels[1:]) if b > a + 1]
        assert not jumps, f"results/{name}: heading levels jump {jumps[:3]}"


def test_a_setting_read_from_a_row_reaches_markdown_inert():
    """protocol_differences and bench_protocol print values from Parquet rows (a torch version, a device name):
    a hand-edited row must not open a link, image or HTML tag in ANSWERS.md."""
    import pandas as pd

    base = {"attention": "favor", "pe": "ape", "qk_norm": "none", "torch_version": "2.14.1"}
    planted = pd.DataFrame([{**base, "torch_version": "[x](javascript:alert(1)) <b>"}])
    text = answers.protocol_differences(pd.DataFrame([base]), planted)
    assert "](" not in text.replace("\\](", "") and "<b>" not in text and "torch_version 2.14.1 → " in text


def test_names_read_from_files_reach_the_generated_blocks_as_text(tmp_path):
    """A pilot's JSON row, a packing result's file name and a folder name are read from files: markup in them
    stays text (no HTML, no link, no code span closed early), and a packing time that is not a number is
    refused with the file named, not printed."""
    import json

    results = tmp_path / "results"
    pilots = results / answers_blocks.PILOTS
    pilots.mkdir(parents=True)
    (pilots / "cifar10_cpu_5ep_seed0_x.json").write_text(json.dumps(
        {"epochs": 5, "attention": "<script>alert(1)</script>", "pe": "[x](javascript:alert(1))", "test_acc": 0.5}))
    write_sweep(pilots / "cifar10_cpu_10ep_start", "cifar10_cpu_10ep_start",
                [{**config_row(dataset="cifar10", seed=0), "test_acc": 0.3}])
    text = answers_blocks.pilots_block(answers_sources.Sources(results))
    assert "<script>" not in text and "[x](" not in text and "&lt;/script&gt;+\\[x\\](javascript" in text
    packing = results / answers_blocks.GPU_FOLDER / answers_blocks.GPU_PACKING
    packing.mkdir(parents=True)
    phase = {"train_s_per_epoch": [1.5, 1.25], "train_images_per_s": 100.0, "peak_mem_mb": [10.0]}
    good = {"single": phase, "packed": phase, "ratio_train_phase": 1.1, "ratio_end_to_end": 1.05}
    (packing / "run<img src=x onerror=alert(1)>.json").write_text(json.dumps(good))
    text = answers_blocks.gpu_packing_block(answers_sources.Sources(results))
    assert "<img" not in text and "run&lt;img" in text and "| 1.5, 1.25 |" in text
    bad = {**good, "packed": {**phase, "train_s_per_epoch": ["<img src=x onerror=alert(2)>"]}}
    (packing / "other.json").write_text(json.dumps(bad))
    with pytest.raises(answers_sources.AnswersError, match=r"other\.json is not a benchmarks/gpu_packing\.py result"):
        answers_blocks.gpu_packing_block(answers_sources.Sources(results))
    # a backtick in a folder name cannot close its code span early
    assert answers_wording.exploratory(["a`<b>"], results) == (
        "_Exploratory: ``a`<b>`` declared no comparisons before it ran._")


def test_the_cost_summary_names_the_variants_that_never_overtake_and_leaves_thin_fits_out_of_its_spans():
    """A review: the summary said the linear variants overtake softmax from N = 300-1,824 while luo_rpe on a linear
    backend is slower than softmax+luo_rpe at every measured N, and the span's lower end came from a fit on 2
    sizes; and the bench tables' redraw column read as a timed cost."""
    import pandas as pd

    cross = pd.DataFrame({"variant": ["favor+ape", "favor+luo_rpe (dense)", "relu+luo_rpe (fft)"],
                          "against": ["softmax+ape", "softmax+luo_rpe", "softmax+luo_rpe"],
                          "how": ["measured", "not reached", "not reached"], "ratio at largest N": [0.2, 1.4, 1.79],
                          "largest N": [4096, 4096, 4096]})
    assert answers_cost.not_overtaking_text(cross) == (
        "still slower than softmax+luo_rpe at the largest N where both ran "
        "(favor+luo_rpe (dense) 1.4, relu+luo_rpe (fft) 1.79 times its step at N = 4,096)")
    # where the counterpart did not fit at a larger N, the line says so (only the linear one runs there)
    oom = cross.assign(**{"counterpart out of memory at N": ["—", "16384", "9216, 16384"]})
    assert answers_cost.not_overtaking_text(oom).endswith("at N = 4,096; softmax+luo_rpe did not fit in memory at "
                                                     "N = 9216, 16384)")
    assert answers_cost.not_overtaking_text(cross[cross["how"] == "measured"]) == ""
    sources = answers_sources.Sources(RESULTS)
    facts = answers_cost.scaling_facts(sources)
    exps = token_scaling.exponents(sources.scaling)
    thin = exps[exps["sizes in the fit"] < answers_cost.MIN_FIT_SIZES]
    assert len(facts["thin fits"]) == len(thin)
    linear = exps[~exps["variant"].str.startswith("softmax") & ~exps["variant"].str.contains(r"\(dense\)")]
    kept = linear[linear["sizes in the fit"] >= answers_cost.MIN_FIT_SIZES]["train step ms / image exponent"]
    low, high = facts["linear time"].split("–")
    assert (low, high) == (fmt(kept.min(), 3), fmt(kept.max(), 3))
    assert low != fmt(linear["train step ms / image exponent"].min(), 3)  # the thin fit's 0.924 is out
    text = (RESULTS / answers.ANSWERS_FILE).read_text(encoding="utf-8")
    summary, = [line for line in text.splitlines() if line.startswith("- Cost (measurements")]
    for variant in thin["variant"]:
        assert f"{variant} (" in summary.split("left out, fitted on fewer than")[1]
    slower = facts["crossovers"]
    for variant in slower.loc[slower["how"] == "not reached", "variant"]:
        assert variant in summary.split("except these, ")[1]
    assert answers_cost.REDRAW_NOT_TIMED in text


def test_every_published_timing_table_says_its_device_and_whether_it_ran_alone():
    """The project standard: a timing table's lead line names the device its rows ran on (common.devices_text)
    and whether the times were alone or contended, as the rows or files know it."""
    sources = answers_sources.Sources(RESULTS)
    bench = answers_blocks.gpu_bench_block(sources).splitlines()[0]
    assert bench.startswith("Each bench trial alone; device: NVIDIA H100")
    times = answers_blocks.gpu_times_block(sources).splitlines()[0]
    assert "device: NVIDIA H100" in times and "contended" in times
    packing = answers_blocks.gpu_packing_block(sources).splitlines()[0]
    assert "Device as these files record it: cuda (the GPU model is not recorded" in packing
    pilots = answers_blocks.pilots_block(sources).splitlines()[0]
    assert pilots.startswith("Rows: device: cpu:") and "possibly contended" in pilots
    assert "each alone; device: cpu:" in answers_blocks.step_times_block(sources)
    ratios = [line for line in answers_cost.cost_section(sources) if line.startswith("Training step relative")]
    assert ratios and all("each bench trial alone" in line and "device: " in line for line in ratios)
    for dataset in sources.strings:
        assert any(line.startswith("Cost: bench trials each alone, device: ")
                   for line in answers.string_section(sources, dataset))
    assert any(line.startswith("Cost, training s per epoch") and "device: " in line
               for line in answers.rotation_section(sources))


def test_a_device_read_from_a_pilot_or_packing_file_reaches_markdown_inert(tmp_path):
    import json

    results = tmp_path / "results"
    pilots = results / answers_blocks.PILOTS
    pilots.mkdir(parents=True)
    (pilots / "cifar10_cpu_5ep_seed0_x.json").write_text(json.dumps(
        {"epochs": 5, "attention": "softmax", "pe": "ape", "test_acc": 0.5, "device_name": "<b>[x](javascript:1)"}))
    write_sweep(pilots / "cifar10_cpu_10ep_start", "cifar10_cpu_10ep_start",
                [{**config_row(dataset="cifar10", seed=0), "test_acc": 0.3}])
    lead = answers_blocks.pilots_block(answers_sources.Sources(results)).splitlines()[0]
    assert "<b>" not in lead and "](" not in lead.replace("\\](", "") and "device: &lt;b&gt;" in lead
    packing = results / answers_blocks.GPU_FOLDER / answers_blocks.GPU_PACKING
    packing.mkdir(parents=True)
    phase = {"train_s_per_epoch": [1.5], "train_images_per_s": 100.0, "peak_mem_mb": [10.0]}
    (packing / "run.json").write_text(json.dumps({"device": "<i>cuda", "single": phase, "packed": phase,
                                                  "ratio_train_phase": 1.1, "ratio_end_to_end": 1.05}))
    lead = answers_blocks.gpu_packing_block(answers_sources.Sources(results)).splitlines()[0]
    assert "<i>" not in lead and "&lt;i&gt;cuda" in lead


def test_most_at_once_is_the_largest_count_of_intervals_holding_one_instant():
    """Brute force: at every instant of a fine grid, the intervals [start, end) that hold it. The per-interval
    meeting count (efficiency.overlaps) over-counts: a long trial beside four short ones run one after another
    meets all four, yet only two ran at once (what the GPU sweep's paragraph said wrongly before: 8 for 4)."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 12))
        start = rng.integers(0, 50, n).astype(float)
        end = start + rng.integers(1, 20, n)
        grid = np.arange(0, 80, 0.5)
        brute = max(int(((start <= t) & (t < end)).sum()) for t in grid)
        assert answers_blocks.most_at_once(start, end) == brute
    long_and_short = (np.array([0.0, 0, 10, 20, 30]), np.array([40.0, 10, 20, 30, 40]))
    assert answers_blocks.most_at_once(*long_and_short) == 2
    assert answers_blocks.most_at_once(np.array([]), np.array([])) == 0


def test_the_sweep_paragraph_is_computed_from_its_rows(tmp_path):
    """Rows with known times: 3 trials of 2 epochs on 1000 images, two side by side, then one; first start to
    last finish 100 s, so 6000 images in 100 s; one trial listed in space.json has no ok row."""
    import json

    from rpevit.sweep.results import SPACE_FILE
    from rpevit.sweep.space import trial_key

    t0 = 1_795_000_000.0  # unix seconds, as older rows store the times
    rows = [{**config_row(dataset="cifar10", seed=s, epochs=2, warmup_epochs=0.5), "test_acc": 0.5,
             "n_train": 1000, "epochs_done": 2, "params": p, "device_name": "GPU X",
             "started_at": t0 + a, "finished_at": t0 + b}
            for s, p, a, b in [(0, 2_000_000, 0, 50), (1, 2_000_000, 10, 60), (2, 2_100_000, 60, 100)]]
    failed = config_row(dataset="cifar10", seed=3)
    folder = write_sweep(tmp_path / "s", "s", rows, failed=[(failed, "boom")])
    keys = [trial_key(r) for r in [*rows, failed]]
    (folder / SPACE_FILE).write_text(json.dumps({"name": "s", "source": "x.yaml", "trial_keys": keys}))
    text = answers_blocks.sweep_run_text(folder)
    assert text.startswith("3 ok rows of the 4 trials its space.json lists, at most 2 running at once")
    assert "0.006 M training images" in text and "in 100 s: **60 training images/s**" in text
    assert "2 epochs, warm-up 0.5 epoch (25 %)" in text and "2.00–2.10 M parameters" in text
    assert "device: GPU X" in text


def test_the_results_readme_gpu_sweep_paragraph_types_no_figure():
    """The GPU sweep's paragraph and the bench's reading notes once typed their figures (7,140 images/s,
    '4 at a time', 'about 1.2'); they now come from the gpu-sweep and gpu-bench blocks."""
    text = (RESULTS / "README.md").read_text(encoding="utf-8")
    section = text.split("**The sweep.**", 1)[1].split("The command:", 1)[0]
    outside = re.sub(r"<!-- BEGIN GENERATED gpu-sweep.*?<!-- END GENERATED gpu-sweep -->", "", section, flags=re.S)
    assert "gpu-sweep" in block_names(section)
    assert not re.findall(r"\d", outside.replace("gpus_per_trial: 0.25", "").replace("cpus_per_trial: 4", "")
                          .replace("14 minutes", ""))
    notes = text.split("How to read it", 1)[1].split("\n## ", 1)[0]
    assert "about 1.2" not in notes and "2.7 M" not in notes


def test_the_provenance_table_types_no_wall_time_the_rows_record():
    """Its wall times were typed once and one disagreed with the rows (cifar10_cpu 'about 15.3 h of wall time'
    for trials that ran 14.8 h from first start to last finish, 12.6 h of it with a trial running): the study-rows
    block now gives each folder's span, hours with a trial running and resumed trials from the rows."""
    text = (RESULTS / "README.md").read_text(encoding="utf-8")
    table = "\n".join(m.group(0) for m in
                      answers_blocks.PROVENANCE_ROW.finditer(text.split("<!-- BEGIN GENERATED study-rows")[0]))
    assert table.count("\n") > 20
    typed = re.findall(r"\d[\d.,]*\s*(?:s|h|min)(?: of)? wall|\d+ trials resumed|\(\d+ rows\)|\d{4}-\d\d-\d\d \d\d:\d\d",
                       table)
    assert not typed, f"typed by hand in the provenance table: {typed}; the study-rows block has them"
    block = answers_blocks.rows_block(answers_sources.Sources(RESULTS))
    row = next(line for line in block.splitlines() if line.startswith("| `cifar10_cpu` |"))
    assert "| 2026-11-22 19:25 → 11-23 10:15 | 12.6 |" in row and "| 6 |" in row
