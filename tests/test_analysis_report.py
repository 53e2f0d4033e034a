"""rpevit/analysis/report.py: the gathered report, its studies and its thread-hours."""
from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from rpevit.analysis import common, gap_closure, report
from rpevit.sweep.results import TRIALS_FILE
from tests.analysis_rows import ENV, bench_rows, config_row, kernel_rows, png_ok, train_rows, write_sweep

REPO = Path(__file__).resolve().parent.parent


def test_thread_hours_count_each_tune_trial_once():
    t0 = pd.Timestamp("2026-11-22 08:00", tz="UTC")
    at = lambda minutes: t0 + pd.Timedelta(minutes=minutes)  # noqa: E731
    frame = pd.DataFrame({  # two members timed in one worker (overlapping spans), and a 2-thread trial
        "tune_trial_id": ["a", "a", "b"], "torch_threads": [1, 1, 2],
        "started_at": [at(0), at(1), at(0)], "finished_at": [at(30), at(60), at(90)]})
    assert report.thread_hours(frame) == pytest.approx(1.0 + 3.0)
    older = frame.assign(started_at=report.unix_seconds(frame["started_at"]),  # float seconds, no trial ids
                         finished_at=report.unix_seconds(frame["finished_at"])).drop(columns="tune_trial_id")
    assert report.thread_hours(older) == pytest.approx(0.5 + 59 / 60 + 3.0)
    assert math.isnan(report.thread_hours(frame.drop(columns="started_at")))


def test_thread_hours_add_the_epochs_trained_before_a_resume_once():
    """A budget ladder run with --rungs-first: the trunk (40 epochs) trains to epoch 16 and pauses, its
    10- and 20-epoch rungs branch at 8 and 16 (inheriting its epoch rows), and it resumes after 16. Its span
    covers epochs 17-40 only; epochs 1-16 were trained once, so count once. A second trial (two members in
    one worker, sharing epoch_s) resumed after a stop at epoch 2 adds its epochs 1-2 once, times its threads."""
    t0 = pd.Timestamp("2026-11-22 08:00", tz="UTC")
    at = lambda minutes: t0 + pd.Timedelta(minutes=minutes)  # noqa: E731
    frame = pd.DataFrame({
        "trial_key": ["trunk", "rung10", "rung20", "m1", "m2"], "tune_trial_id": ["t", "r10", "r20", "g", "g"],
        "torch_threads": [1, 1, 1, 2, 2], "resumed_from_epoch": [16, 8, 16, 2, 2],
        "started_at": [at(0)] * 5, "finished_at": [at(60), at(6), at(12), at(30), at(30)]})
    trunk = [("trunk", e, 90.0 + e) for e in range(1, 41)]
    inherited = [(rung, e, 90.0 + e) for rung, upto in (("rung10", 8), ("rung20", 16)) for e in range(1, upto + 1)]
    cooled = [("rung10", e, 70.0 + e) for e in (9, 10)] + [("rung20", e, 70.0 + e) for e in range(17, 21)]
    members = [(m, e, 300.0 + e) for m in ("m1", "m2") for e in range(1, 6)]
    epochs = pd.DataFrame(trunk + inherited + cooled + members, columns=["trial_key", "epoch", "epoch_s"])
    spans = 1.0 + 0.1 + 0.2 + 2 * 0.5
    assert report.thread_hours(frame) == pytest.approx(spans)  # without epoch rows: the spans only
    before = (sum(90.0 + e for e in range(1, 17)) + 2 * (301.0 + 302.0)) / 3600
    assert report.earlier_epoch_hours(frame, epochs) == pytest.approx(before)
    assert report.thread_hours(frame, epochs) == pytest.approx(spans + before)
    # run in the default order, the trunk trains every epoch inside its span: nothing is added for the ladder
    straight = frame.assign(resumed_from_epoch=[0, 8, 16, 2, 2])
    assert report.earlier_epoch_hours(straight, epochs) == pytest.approx(2 * (301.0 + 302.0) / 3600)
    # rows of a version that did not record resumes, or a folder without epoch rows: nothing to add
    assert report.earlier_epoch_hours(frame.drop(columns="resumed_from_epoch"), epochs) == 0.0
    assert report.earlier_epoch_hours(frame, None) == 0.0


@pytest.mark.slow
def test_report_gathers_every_section(tmp_path):
    parent = tmp_path / "results"
    write_sweep(parent / "main", "main", train_rows())
    write_sweep(parent / "scaling", "scaling", bench_rows())
    write_sweep(parent / "kmse", "kmse", kernel_rows()[:8])
    rotinv = parent / "rotinv"
    rotinv.mkdir()
    (rotinv / "rotinv_concentration.md").write_text("# rotinv random mode\n\n| m | x |\n|---|---|\n| 4 | 0.25 |\n")
    subprocess.run([sys.executable, str(REPO / "analysis" / "report.py"), str(parent)], check=True,
                   capture_output=True, cwd=tmp_path)
    text = (parent / "report.md").read_text()
    for heading in ("## Accuracy and gap closure", "## Efficiency", "## Token scaling", "## Kernel MSE",
                    "## Rotation-invariant RPE",
                    "## Environment"):
        assert heading in text
    assert ENV["git_commit"] in text and ENV["torch_version"] in text
    assert "| thread-hours in trials | resumed after a stop |" in text
    assert "| 4 | 0.25 |" in text and "_from rotinv/rotinv_concentration.md_" in text
    assert pd.read_parquet(parent / "main" / TRIALS_FILE)["status"].eq("ok").all()
    for png in ("gap_closure.png", "efficiency_pareto.png", "token_scaling.png", "kernel_mse_vs_m_0.png"):
        assert png_ok(parent / png) and f"]({png})" in text


# ---- issue 31, item 4: a user's own sweep under results/ stays out of the published report
@pytest.mark.slow
def test_report_reads_only_the_studies_it_lists_and_names_the_others(tmp_path):
    parent = tmp_path / "results"
    write_sweep(parent / "study", "study", train_rows())
    smoke = [{**config_row(attention="softmax", pe="none", seed=s, dataset="digits"), "test_acc": 0.5 + s / 100}
             for s in range(2)]  # a variant only the smoke folder has
    write_sweep(parent / "smoke", "smoke", smoke)
    (parent / common.STUDIES_FILE).write_text("# the published studies\nstudy\n\nmissing  # not run yet\n")
    assert common.trial_files(parent) == [parent / "study" / TRIALS_FILE]
    text = report.build_report(parent)
    assert "| study | train | 15 |" in text and "| smoke |" not in text
    assert "| softmax | none |" not in text and "| softmax | ape |" in text  # no smoke row in any table
    assert "_not read: smoke (not listed in STUDIES" in text.split("## Environment")[0]
    assert "listed in STUDIES but holding no trials.parquet: missing" in text
    assert "not read: smoke" in gap_closure.build(parent)  # each script says so too
    (parent / common.STUDIES_FILE).unlink()  # no list: every folder, as before
    assert "| smoke | train | 2 |" in report.build_report(parent)


# ---- issue 39: what the analysis reads is untrusted, what it writes goes through no link
def run_report(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "analysis" / "report.py"), str(folder)], capture_output=True,
                          text=True, cwd=folder.parent)


@pytest.mark.slow
@pytest.mark.parametrize("planted", ["report.md", "gap_closure.png"])
def test_the_report_refuses_to_write_through_a_planted_link(tmp_path, planted):
    folder = write_sweep(tmp_path / "main", "main", train_rows())
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (folder / planted).symlink_to(victim)
    done = run_report(folder)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0 and f"{folder / planted} is a symbolic link" in done.stderr
    assert victim.read_text() == "precious" and (folder / planted).is_symlink()


def test_analysis_outputs_are_atomic_and_refuse_links(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name in ("study.md", "table.csv", "figure.png"):
        (tmp_path / name).symlink_to(victim)
    with pytest.raises(SystemExit, match="study.md is a symbolic link"):
        common.write_markdown(tmp_path / "study.md", "# x")
    with pytest.raises(SystemExit, match="table.csv is a symbolic link"):
        common.write_text_file(tmp_path / "table.csv", "a,b\n")
    fig = common.pyplot().figure()
    with pytest.raises(SystemExit, match="figure.png is a symbolic link"):
        common.save_figure(fig, tmp_path / "figure.png")
    assert victim.read_text() == "precious"
    common.write_markdown(tmp_path / "fine.md", "# fine")  # a plain path: written, no temp file left
    assert (tmp_path / "fine.md").read_text() == "# fine\n" and not list(tmp_path.glob(".*.tmp"))


def test_a_long_title_is_wrapped_to_the_figure_and_clears_the_panels(tmp_path):
    """The headline figure of cifar10_ladder40_cpu (a study on four machines: its title names four devices) was
    saved 2,672 pixels wide, its two panels a strip in the middle (bbox "tight" widens the image to the title),
    and once wrapped after the caller's tight_layout, the title's lines ran into the panels' titles."""
    import struct

    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax in axes:
        ax.plot([1, 2], [1, 2])
        ax.set_title("softmax − FAVOR+, each with the same encoding", fontsize=10)
    fig.suptitle("CIFAR-10: the gap per encoding against budget (4 devices: " + "; ".join(
        f"cpu:x86_64 AMD EPYC (AVX512) x1 threads ({n} rows)" for n in (20, 44, 45, 51)) + ")", fontsize=10)
    fig.tight_layout()  # as the headline does: a one-off layout before save_figure wraps the title
    title = fig._suptitle
    common.save_figure(fig, tmp_path / "figure.png")
    width, _ = struct.unpack(">II", (tmp_path / "figure.png").read_bytes()[16:24])
    assert width <= 10 * 110 + 40, width  # the figure's own width at save_figure's 110 dpi, not the title's
    assert title.get_text().count("\n") >= 2
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()  # save_figure closed the figure: its canvas is gone
    bottom = title.get_window_extent(renderer).y0
    assert all(ax.title.get_window_extent(renderer).y1 <= bottom for ax in axes)  # above the panels' titles


def test_values_from_files_are_inert_markdown():
    assert common.md_text("sparse_cayley_string (f=0.05)") == "sparse_cayley_string (f=0.05)"  # ordinary: as is
    assert common.md_text("<script>alert(1)</script>") == "&lt;script&gt;alert(1)&lt;/script&gt;"
    assert common.md_text("[x](javascript:alert(1))") == "\\[x\\](javascript:alert(1))"
    assert common.md_text("<img src=x onerror=alert(1)>") == "&lt;img src=x onerror=alert(1)&gt;"
    assert common.md_text("a\nb\r\nc\u2028d\x1b[31m") == "a b c d [31m".replace("[", "\\[")
    assert common.md_text("\\[x](y)") == "\\\\\\[x\\](y)"  # a backslash cannot un-escape the bracket
    assert common.code_span("results") == "`results`" and common.code_span("a`b") == "``a`b``"
    assert common.short("x" * 10, limit=4) == "xxxx… (10 characters)" and common.short("xy", limit=4) == "xy"


# ---- audit: a Markdown file the report includes is read through no link, and forms no link
def test_a_linked_rotinv_file_is_refused_not_read(tmp_path):
    """rotinv_section searches all of results_dir for rotinv_concentration.md and copies it into report.md:
    `someone/rotinv_concentration.md -> /etc/secret` published the secret (failed before: its text was in the
    section). open_regular now opens no link (O_NOFOLLOW): one line naming the file. A linked folder is not
    searched (Path.rglob does not descend into one)."""
    secret = tmp_path / "secret.txt"
    secret.write_text("# r\n\nTOP-SECRET-TOKEN\n")
    parent = tmp_path / "results"
    (parent / "someone").mkdir(parents=True)
    (parent / "someone" / report.ROTINV_FILE).symlink_to(secret)
    with pytest.raises(SystemExit) as caught:
        report.rotinv_section(parent)
    said, link = str(caught.value), parent / "someone" / report.ROTINV_FILE
    assert said.startswith(f"error: {link}: it is a symbolic link") and "\n" not in said
    assert "allowed: " in said and "TOP-SECRET-TOKEN" not in said
    (parent / "someone" / report.ROTINV_FILE).unlink()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / report.ROTINV_FILE).write_text("# r\n\nTOP-SECRET-TOKEN\n")
    (parent / "linked").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert report.rotinv_section(parent) is None  # a linked folder: not searched
    (parent / "real").mkdir()
    (parent / "real" / report.ROTINV_FILE).write_text("# r\n\nthe real one\n")  # a plain file: read as before
    assert "the real one" in report.rotinv_section(parent)


@pytest.mark.slow
def test_the_report_never_includes_a_linked_rotinv_file(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-TOKEN")
    parent = tmp_path / "results"
    write_sweep(parent / "main", "main", train_rows())
    (parent / "someone").mkdir()
    (parent / "someone" / report.ROTINV_FILE).symlink_to(secret)
    try:
        text = report.build_report(parent)
    except SystemExit as err:  # refused: one line naming the link
        text = str(err)
        assert f"{parent / 'someone' / report.ROTINV_FILE}: it is a symbolic link" in text
    assert "TOP-SECRET-TOKEN" not in text and secret.read_text() == "TOP-SECRET-TOKEN"


def test_results_readers_open_no_link(tmp_path):
    """open_regular, the one opener of every results file (trials/epochs Parquet, space.json, STUDIES, the
    text files the report includes), refuses a symbolic link by name, whatever it points to."""
    from rpevit.sweep import results

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "link"
    link.symlink_to(victim)
    with pytest.raises(results.DamagedResults, match=f"^{link} cannot be read .*it is a symbolic link"):
        with results.open_regular(link):
            pass
    with pytest.raises(results.ConfigError, match=f"^{link}: it is a symbolic link.*; allowed: text"):
        results.read_regular_bytes(link, 100, "text")
    folder = write_sweep(tmp_path / "main", "main", train_rows()[:2])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / TRIALS_FILE).symlink_to(folder / TRIALS_FILE)
    with pytest.raises(results.DamagedResults, match=f"{tmp_path / 'other' / TRIALS_FILE} .*symbolic link"):
        results.read_results_table(tmp_path / "other" / TRIALS_FILE)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nothing")
    with pytest.raises(results.ConfigError, match="dangling: it is a symbolic link"):
        results.read_regular_bytes(dangling, 100, "text")
    assert results.read_regular_bytes(victim, 100, "text") == b"precious"  # a regular file: read as before
    assert results.read_results_table(folder / TRIALS_FILE).num_rows == 2


def test_included_markdown_forms_no_reference_link_image_or_definition():
    """inert_markdown escaped only `](`, so reference-style links and images and link reference definitions
    survived (failed before). Every [ and ] is escaped now (a bracket already escaped stays as it is, and a
    backslash before one cannot un-escape it), so no link, image, definition or footnote can form; prose
    renders the same (a backslash-escaped bracket renders as the bracket)."""
    text = report.inert_markdown("See [the data][1] and ![p][2].\n\n[1]: https://evil.example/phish\n"
                                 "   [2]: https://evil.example/p.png \"t\"\n[x] [y](javascript:alert(1)) [^n]\n")
    assert "\\[the data\\]\\[1\\]" in text and "!\\[p\\]\\[2\\]" in text
    assert "\\[1\\]: https\\://evil.example/phish" in text and "   \\[2\\]: https" in text
    assert not re.search(r"(?<!\\)[\[\]]", text), text  # every bracket escaped
    for line in text.splitlines():  # no line is a link reference definition
        assert not re.match(r" {0,3}\[", line), line
    for sneaky in ("\\[x\\](javascript:alert(1))", "\\\\[x\\\\](javascript:alert(1))", "\\\\\\[1]: https://e"):
        escaped = report.inert_markdown(sneaky)
        for m in re.finditer(r"(\\*)[\[\]]", escaped):  # each bracket after an odd run of backslashes: literal
            assert len(m.group(1)) % 2 == 1, (sneaky, escaped)
    assert report.inert_markdown("\\[already\\]") == "\\[already\\]"  # escaped already: unchanged
    prose = "grid 8x8 (coordinates in [-1/2, 1/2]^2, t in [0, 2]), p in [1, 7] | a | b |\n|---|---|"
    assert report.inert_markdown(prose) == prose.replace("[", "\\[").replace("]", "\\]")
    assert report.inert_markdown("plain prose: m = 4, 95% bound") == "plain prose: m = 4, 95% bound"
    assert report.inert_markdown("a < b & c > d") == "a &lt; b &amp; c &gt; d"


MALICIOUS = "<script>alert(1)</script>\n| [x](javascript:alert(1)) <img src=x onerror=alert(1)>"


def assert_inert(text: str) -> None:
    assert "<script" not in text and "<img" not in text and "<b>" not in text
    assert not re.search(r"(?<!\\)\]\(javascript", text)  # no link can form: every such ] is escaped
    for line in text.splitlines():  # a line break inside a value would have split a table row
        assert not line.startswith("|") or line.rstrip().endswith("|"), line


@pytest.mark.slow
def test_names_from_files_reach_the_report_inert_and_bounded(tmp_path, figures):
    parent = tmp_path / "results"
    rows = train_rows()
    for r in rows:
        if r["attention"] == "favor":
            r["attention"] = MALICIOUS
        if r["pe"] == "rope":
            r["pe"] = "x" * 1_000_000  # a megabyte name: cut before any table or figure
    folder = write_sweep(parent / "main<img src=x onerror=alert(2)>", "main", rows)  # a folder name: one line
    (folder / "rotinv").mkdir()
    (folder / "rotinv" / "rotinv_concentration.md").write_text("# r\n\n[x](javascript:alert(3)) <b>hi</b>\n")
    text = report.build_report(parent)
    assert_inert(text)
    assert "&lt;script&gt;alert(1)&lt;/script&gt; \\| \\[x\\](javascript:alert(1))" in text
    assert "| main&lt;img src=x onerror=alert(2)&gt; | train |" in text and "&lt;b&gt;hi&lt;/b&gt;" in text
    assert ("x" * common.LABEL_LIMIT + "… (1,000,000 characters)") in text and "x" * (common.LABEL_LIMIT + 1) not in text
    assert max(map(len, text.splitlines())) < 20 * common.LABEL_LIMIT
    labels = [t.get_text() for fig in figures for t in fig.findobj(lambda a: hasattr(a, "get_text"))]
    assert labels and max(map(len, labels)) < 2 * common.LABEL_LIMIT
    frame = common.load_trials(folder)
    assert {len(v) for v in frame["pe"] if v.startswith("xxx")} == {common.LABEL_LIMIT + len("… (1,000,000 characters)")}


@pytest.mark.slow
def test_a_metric_stored_as_text_is_one_line_not_a_traceback(tmp_path, capsys):
    parent = tmp_path / "results"
    folder = write_sweep(parent / "main", "main", train_rows())
    write_sweep(parent / "other", "other", train_rows())
    frame = pd.read_parquet(folder / TRIALS_FILE)
    frame["test_acc"] = frame["test_acc"].astype(str)
    frame.to_parquet(folder / TRIALS_FILE)
    done = run_report(folder)
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0
    assert "column 'test_acc' holds text (such as '0.9'" in done.stderr and str(folder / TRIALS_FILE) in done.stderr
    text = report.build_report(parent)  # under a parent: that folder is skipped, the rest reported
    assert "| main | ? |" in text and "| other | train | 15 |" in text


def test_a_declared_study_beside_the_report_is_named_as_the_answer_at_validated_settings(tmp_path):
    """A reviewer: the report's studies ran settings chosen before validation (some on test), and the declared
    reruns were only in the 'not read' list. A declared folder the report does not read is now named, by its
    folder name, as answering the same questions at settings chosen on validation; none: no sentence."""
    from rpevit.sweep import declaration
    from rpevit.sweep.declaration import parse

    parent = tmp_path / "results"
    write_sweep(parent / "study", "study", train_rows())
    (parent / common.STUDIES_FILE).write_text("study\n")
    assert report.superseding_note(parent) == ""
    rerun = parent / "rerun_cpu"
    rerun.mkdir(parents=True)
    declaration.record(rerun, parse({"metric": "judged", "seeds": [0, 1], "families": [
        {"name": "gap", "comparisons": [[{"attention": "softmax", "pe": "ape"}, {"attention": "favor", "pe": "ape"}]]}]},
        "x"), rows_exist=False, redeclare=False)
    write_sweep(rerun, "rerun_cpu", train_rows())
    note = report.superseding_note(parent)
    assert "The declared studies `rerun_cpu` ask the same questions at settings chosen on" in note
    assert note in report.build_report(parent)


def test_one_value_is_not_printed_as_a_range():
    import pandas as pd

    from rpevit.analysis import kernel_mse

    assert kernel_mse.span_text(pd.Series([4000, 4000])) == "4000"  # was '4000–4000'
    assert kernel_mse.span_text(pd.Series([1000, 4000])) == "1000–4000"


def test_hours_running_is_the_length_of_the_union_of_the_trial_spans():
    """Brute force on a grid of seconds: an instant counts once however many trials hold it, a gap between
    sessions not at all. Timestamps (as rows store them now) and float seconds (older rows) alike."""
    import numpy as np

    rng = np.random.default_rng(1)
    for _ in range(100):
        n = int(rng.integers(1, 10))
        start = rng.integers(0, 3600, n).astype(float)
        end = start + rng.integers(1, 1800, n)
        grid = np.arange(0, 5400) + 0.5
        brute = sum(bool(((start <= t) & (t < end)).any()) for t in grid) / 3600
        frame = pd.DataFrame({"started_at": start, "finished_at": end})
        assert report.hours_running(frame) == pytest.approx(brute)
    stamps = pd.DataFrame({"started_at": pd.to_datetime([0, 1800, 7200], unit="s", utc=True),
                           "finished_at": pd.to_datetime([3600, 3600, 9000], unit="s", utc=True)})
    assert report.hours_running(stamps) == pytest.approx(1.5)  # 0-3600 once, then 7200-9000: the gap not counted
    assert math.isnan(report.hours_running(pd.DataFrame({"started_at": [math.nan], "finished_at": [math.nan]})))


def test_time_span_names_first_start_and_last_finish_leaving_out_what_repeats():
    t = lambda text: pd.Timestamp(text, tz="UTC").timestamp()  # noqa: E731
    frame = lambda a, b: pd.DataFrame({"started_at": [t(a), t(a) + 60], "finished_at": [t(b) - 60, t(b)]})  # noqa: E731
    assert report.time_span(frame("2026-11-22 19:25", "2026-11-23 10:15")) == "2026-11-22 19:25 → 11-23 10:15"
    assert report.time_span(frame("2026-11-22 08:26", "2026-11-22 08:43")) == "2026-11-22 08:26 → 08:43"
    assert report.time_span(frame("2026-12-31 23:00", "2027-01-01 01:00")) == "2026-12-31 23:00 → 2027-01-01 01:00"
    assert report.time_span(pd.DataFrame()) == "—"
