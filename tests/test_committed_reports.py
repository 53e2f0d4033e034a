"""Every report committed under results/ is what today's analysis code writes from the committed rows.

answers.py --check guards ANSWERS.md and the generated blocks; these are the other generated pages (report.md,
confirmatory.md, validation_choice.md, the lease SUMMARY.md, ...). Four of them had fallen behind the code that
writes them (found 2026-12-01: gpu_h100/report.md, kernel_mse/kernel_mse.md and report.md, token_scaling.md):
a reader of the committed page saw text the code no longer writes, without a device on its timing tables. Each
page's text is built in process from the committed rows, the figures not drawn (save_figure stubbed in every
module that draws: a test never rewrites a committed file), and compared with the file; a stale one is named with
the command that regenerates it.
"""
from __future__ import annotations

import difflib
import sys
from pathlib import Path
from typing import Callable

import pytest

from rpevit.analysis import (answers_sources, budget_ladder, common, confirmatory, gap_closure, headline, kernel_mse,
                             report, rotation, rotinv_concentration, string_study, token_scaling, validation_choice)
from rpevit.analysis.efficiency import figure as efficiency_figure
from rpevit.analysis.gap_closure import figure as gap_closure_figure

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path("results")  # relative, as the committed pages were written from a checkout's root
DRAWING_MODULES = (budget_ladder, efficiency_figure, gap_closure_figure, headline, kernel_mse, string_study,
                   token_scaling)


def study(title: str, text: str | None) -> str:
    """What common.write_study writes: the title, then the text (None: the script stops, nothing written)."""
    assert text is not None, "the script would find no rows and write nothing"
    return f"# {title}\n\n{text}".rstrip() + "\n"


def lease_summary(folder: Path) -> str:
    sys.path.insert(0, str(ROOT / "benchmarks" / "lease"))
    try:
        import summary
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "lease"))
    return summary.summary(folder)


def pages() -> dict[str, tuple[Callable[[], str], str]]:
    """Committed page -> (its text as the code builds it, the command that writes it)."""
    out: dict[str, tuple[Callable[[], str], str]] = {}
    for folder in (RESULTS, RESULTS / "gpu_h100", RESULTS / "kernel_mse"):
        out[f"{folder}/report.md"] = (lambda f=folder: report.build_report(f).rstrip() + "\n",
                                      f"python analysis/report.py {folder}")
    out["results/kernel_mse/kernel_mse.md"] = (
        lambda: study("Kernel MSE", kernel_mse.build(RESULTS / "kernel_mse")),
        "python analysis/kernel_mse.py results/kernel_mse")
    out["results/token_scaling_cpu/token_scaling.md"] = (
        lambda: study("Token scaling", token_scaling.build(RESULTS / "token_scaling_cpu")),
        "python analysis/token_scaling.py results/token_scaling_cpu")
    out["results/rotation_mnist_cpu/rotation.md"] = (
        lambda: study("The rotation study", rotation.build(RESULTS / "rotation_mnist_cpu",
                                                           [RESULTS / "bench_rotation_mnist_cpu"])),
        "python analysis/rotation.py results/rotation_mnist_cpu --bench results/bench_rotation_mnist_cpu")
    for name in ("cifar10_ladder_cpu", "cifar10_ladder40_cpu"):
        out[f"results/{name}/budget_ladder.md"] = (
            lambda n=name: study("Budget ladder: accuracy against training budget", budget_ladder.build(RESULTS / n)),
            f"python analysis/budget_ladder.py results/{name}")
    for name in ("cifar10_ladder_cpu", "mnist_headline_cpu", "cifar10_ladder40_cpu"):
        out[f"results/{name}/confirmatory.md"] = (
            lambda n=name: study("Declared comparisons (confirmatory)", confirmatory.build(RESULTS / n)),
            f"python analysis/confirmatory.py results/{name}")
    for folder in sorted((ROOT / "results").glob("*_val_*")):
        out[f"results/{folder.name}/validation_choice.md"] = (
            lambda n=folder.name: study("A choice made on validation", validation_choice.build(RESULTS / n)),
            f"python analysis/validation_choice.py results/{folder.name}")
    out["results/rotinv_concentration/rotinv_concentration.md"] = (  # a seeded simulation, not rows (~8 s)
        lambda: rotinv_concentration.table(*rotinv_concentration.measure(
            8, [1.0, 1.0, 1.0], list(rotinv_concentration.DEFAULT_DRAWS), 100, 0.05, 0)),
        "python analysis/rotinv_concentration.py results/rotinv_concentration")
    for lease in sorted((ROOT / "results").glob("gpu_*/lease_*")):
        rel = lease.relative_to(ROOT).as_posix()
        out[f"{rel}/SUMMARY.md"] = (lambda r=rel: lease_summary(Path(r)), f"python benchmarks/lease/summary.py {rel}")
    return out


@pytest.fixture
def no_figures(monkeypatch):
    """Every module that draws saves through its own `save_figure` name: stubbed, the figure closed unsaved."""
    from rpevit.analysis.common import pyplot

    def closed(fig, path):
        pyplot().close(fig)
        return Path(path)
    for module in DRAWING_MODULES:
        monkeypatch.setattr(module, "save_figure", closed)
    monkeypatch.setattr(gap_closure, "save_figure", closed, raising=False)


@pytest.fixture
def as_in_a_clean_checkout(monkeypatch):
    """The committed pages were written in a checkout holding only what git tracks under results/. A user's own
    folder there (README command 1 writes results/smoke/; CI runs command 1 before the tests) is not part of them:
    report.md's note on the folders STUDIES leaves out must not name it. Folders directly under results/ that it
    does not publish (answers_sources.published_folders: .gitignore's re-includes and STUDIES) are left out."""
    root = (ROOT / "results").resolve()
    published = answers_sources.published_folders(root) or set()
    listed = common.sweep_folders

    def tracked(results_dir: Path) -> list[Path]:
        found = listed(results_dir)
        if Path(results_dir).resolve() != root:
            return found
        return [p for p in found if p.parent.name in published]
    monkeypatch.setattr(common, "sweep_folders", tracked)


def test_every_generated_page_is_listed_here():
    """A new generated page under results/ joins `pages()`, or this test names it."""
    listed = set(pages())
    generated = {p.relative_to(ROOT).as_posix() for p in (ROOT / "results").rglob("*.md")
                 if p.name in {"report.md", "confirmatory.md", "validation_choice.md", "budget_ladder.md",
                               "rotation.md", "token_scaling.md", "kernel_mse.md", "SUMMARY.md",
                               "string_study.md", "gap_closure.md", "efficiency.md", "rotinv_concentration.md"}}
    assert generated <= listed, f"generated pages no test compares with the code: {sorted(generated - listed)}"


@pytest.mark.parametrize("page", sorted(pages()))
def test_the_committed_page_is_what_the_code_writes_today(page, no_figures, as_in_a_clean_checkout, monkeypatch,
                                                          capsys):
    monkeypatch.chdir(ROOT)
    build, command = pages()[page]
    expected = build()
    capsys.readouterr()  # what the builders print (the figures they would write) is not the page
    committed = (ROOT / page).read_text(encoding="utf-8")
    if committed != expected:
        diff = "".join(list(difflib.unified_diff(committed.splitlines(True), expected.splitlines(True),
                                                 "committed", "code today", n=1))[:40])
        pytest.fail(f"{page} is stale: regenerate with `{command}` and commit it\n{diff}")
