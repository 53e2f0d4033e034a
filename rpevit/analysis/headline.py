"""The answer a reader sees first (issue 58, item 8): does a relative encoding narrow the gap between softmax
and linear-time attention on CIFAR-10, and does that hold across budgets?

Two generated things, from the newest published CIFAR-10 budget ladder that has a complete rung
(HEADLINE_STUDIES, newest first):

- a figure, one panel per linear backend: each encoding's gap softmax+pe − linear+pe (judged accuracy, points)
  against the training budget, with its 95% Welch interval and n;
- a table of at most 12 rows: per linear backend and relative encoding, the contrast of gaps
  gap(ape) − gap(rpe) = (softmax+ape − linear+ape) − (softmax+rpe − linear+rpe) at the longest rung where the
  backend's eight cells hold every seed, on the judged accuracy and, beside it, on the training draw
  (test_acc), each at its Holm level within its backend's three contrasts, with its verdict.

The contrast is judged by the same code as a declared one (rpevit.analysis.confirmatory.judge_family, over
the rows confirmatory.usable_rows admits). Where the study declared exactly this contrast family, the table
is its confirmatory answer; otherwise it is exploratory and says so (a study that declared each gap alone,
as cifar10_ladder_cpu did, did not declare their difference).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from rpevit.analysis import confirmatory, stats, variants
from rpevit.analysis.common import code_span, devices_text, fmt, markdown_table, pyplot, read_trials, save_figure
from rpevit.sweep.declaration import Declaration, Family, parse, read_record, redeclarations

HEADLINE_STUDIES = ("cifar10_ladder40_cpu", "cifar10_ladder_cpu")  # newest first
FIGURE = "headline_gap_vs_budget.png"  # under results/
BACKENDS = {"favor": "FAVOR+", "relu": "Performer-ReLU"}
RPES = ("luo_rpe", "rope", "circulant_string")
ENCODINGS = ("ape", *RPES)
PRIMARY, SECONDARY = "judged", "test_acc"


def contrast_spec(backend: str) -> dict[str, Any]:
    """The contrast-of-gaps family of one backend, as a `declare:` block writes it."""
    def gap(pe: str) -> list[dict[str, str]]:
        return [{"attention": "softmax", "pe": pe}, {"attention": backend, "pe": pe}]

    return {"name": f"does an RPE narrow the softmax / {BACKENDS[backend]} gap (gap with ape minus gap with the RPE)",
            "for_each": "epochs", "secondary_metric": SECONDARY, "contrasts": [[gap("ape"), gap(pe)] for pe in RPES]}


@dataclass(frozen=True)
class Rung:
    """One backend's contrasts at one budget: the judged and training-draw outcomes, in RPES order."""

    backend: str
    epochs: int
    primary: list[confirmatory.Outcome]
    secondary: list[confirmatory.Outcome]

    @property
    def complete(self) -> bool:
        return all(o.complete for o in self.primary + self.secondary)


@dataclass(frozen=True)
class Headline:
    """What the README shows: the study, whether its contrasts were declared, n, each backend's rungs and
    the per-encoding gaps for the figure."""

    study: str
    declared: dict[str, bool]  # backend -> its contrast family was declared before the run
    n: int
    rungs: dict[str, list[Rung]]  # backend -> its rungs, shortest first
    gaps: pd.DataFrame  # backend, pe, epochs, interval (points), n_a, n_b
    devices: str
    draws: str = "fresh draws"  # "8 fresh draws": the random-feature rows' eval_draws, as they recorded it
    # backend -> an older study's headline holding a complete rung for it, where this study has none yet (a newer
    # study without a complete Performer-ReLU rung does not hide an older study's complete answer)
    earlier: dict[str, "Headline"] = field(default_factory=dict)

    def longest_complete(self, backend: str) -> Rung | None:
        complete = [r for r in self.rungs.get(backend, []) if r.complete]
        return complete[-1] if complete else None


def _same_contrasts(fam: Family, spec: dict[str, Any]) -> bool:
    mine = parse({"metric": PRIMARY, "seeds": [0, 1], "families": [spec]}, "headline").families[0]
    return fam.contrasts == mine.contrasts and fam.for_each == mine.for_each


def _declared_rows(folder: Path, frame: pd.DataFrame) -> tuple[Declaration, pd.DataFrame]:
    """The study's declaration in force (its seeds and alpha judge the table) and the rows its confirmatory
    table uses (confirmatory.usable_rows); for a study that declared nothing, one made here over the seeds
    its rows ran, and every row (exploratory)."""
    record = read_record(folder)
    if record is not None:
        entry = record["declarations"][-1]
        decl = entry["parsed"]
        rows, _ = confirmatory.usable_rows(frame, decl, float(entry["recorded_at"]), bool(redeclarations(record)))
        return decl, rows
    seeds = sorted({int(s) for s in frame["seed"]})
    seeds = seeds if len(seeds) >= 2 else [*seeds, max(seeds, default=0) + 1]  # a declaration needs 2 seeds
    return parse({"metric": PRIMARY, "seeds": seeds, "families": [contrast_spec("favor")]}, "headline"), frame


def headline(results_dir: Path, published: Callable[[Path], bool] = lambda folder: True) -> Headline | None:
    """The headline of the newest published ladder with a complete rung (else of the newest with rows).
    `published`: whether a folder is read into the published text (answers passes its is_published)."""
    found = []
    for name in HEADLINE_STUDIES:
        folder = Path(results_dir) / name
        if not (folder / "trials.parquet").is_file() or not published(folder):
            continue
        h = _headline_of(folder)
        if h is not None:
            found.append(h)
    shown = next((h for h in found if any(h.longest_complete(b) for b in BACKENDS)), found[0] if found else None)
    if shown is None:
        return None
    later = found[found.index(shown) + 1:]  # older studies (HEADLINE_STUDIES is newest first)
    earlier = {b: next(h for h in later if h.longest_complete(b)) for b in BACKENDS
               if shown.longest_complete(b) is None and any(h.longest_complete(b) for h in later)}
    return replace(shown, earlier=earlier)


def _headline_of(folder: Path) -> Headline | None:
    frame = read_trials(folder, ["train"]).frame
    if frame.empty or "epochs" not in frame:
        return None
    frame = frame[frame["status"] == "ok"] if "status" in frame else frame
    decl, rows = _declared_rows(folder, frame)
    rows = rows.reset_index(drop=True)
    records = rows.to_dict("records")
    declared, rungs = {}, {}
    for backend in BACKENDS:
        spec = contrast_spec(backend)
        fam = parse({"metric": PRIMARY, "seeds": list(decl.seeds), "families": [spec]}, "headline").families[0]
        declared[backend] = any(f.kind == "contrast" and _same_contrasts(f, spec) for f in decl.families) \
            and read_record(folder) is not None
        judge_decl = Declaration(metric=PRIMARY, seeds=decl.seeds, families=(fam,), alpha=decl.alpha)
        out = []
        for epochs in sorted({int(e) for e in rows["epochs"]}):
            by_metric = [confirmatory.judge_family(rows, confirmatory.metric_values(rows, m), fam,
                                                   {"epochs": epochs}, judge_decl, m) for m in (PRIMARY, SECONDARY)]
            if any(o.have[1] > 0 or o.have[3] > 0 for o in by_metric[0]):  # the backend's own cells (b1, b2) have rows
                out.append(Rung(backend, epochs, *by_metric))
        rungs[backend] = out
    gaps = []
    values = confirmatory.metric_values(rows, PRIMARY)
    # a declared study's gap is drawn once both its cells hold every declared seed (an interim estimate is the
    # second look the declaration rules out); a study that declared nothing: from 2 seeds a cell
    need = len(decl.seeds) if read_record(folder) is not None else 2
    for backend in BACKENDS:
        for pe in ENCODINGS:
            for epochs in sorted({int(e) for e in rows["epochs"]}):
                fixed = {"epochs": epochs}
                a = confirmatory.cell_values(records, values, {"attention": "softmax", "pe": pe}, fixed)
                b = confirmatory.cell_values(records, values, {"attention": backend, "pe": pe}, fixed)
                if len(a) >= need and len(b) >= need:
                    iv = stats.welch(np.array(list(a.values())) * 100, np.array(list(b.values())) * 100)
                    gaps.append({"backend": backend, "pe": pe, "epochs": epochs, "interval": iv})
    devices = devices_text(rows)
    random = rows[rows["attention"].astype(str) != "softmax"]
    counts = sorted({int(d) for d in random["eval_draws"].dropna()}) if "eval_draws" in random else []
    draws = f"{' or '.join(str(c) for c in counts)} fresh draws" if counts else "fresh draws"
    return Headline(folder.name, declared, len(decl.seeds), rungs, pd.DataFrame(gaps), devices, draws)


def figure(h: Headline, path: Path) -> Path:
    """One panel per linear backend: each encoding's gap against budget, with its 95% interval."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(BACKENDS), figsize=(10, 4.2), sharey=True)
    colours = variants.colours(variants.PE, list(ENCODINGS))
    for ax, (backend, label) in zip(np.atleast_1d(axes), BACKENDS.items()):
        g = h.gaps[h.gaps["backend"] == backend] if not h.gaps.empty else h.gaps
        for pe in ENCODINGS:
            cell = g[g["pe"] == pe].sort_values("epochs") if not g.empty else g
            if cell.empty:
                continue
            point = np.array([iv.point for iv in cell["interval"]])
            lo = point - np.array([iv.lo for iv in cell["interval"]])
            hi = np.array([iv.hi for iv in cell["interval"]]) - point
            n = sorted({iv.n for iv in cell["interval"]})
            ax.errorbar(cell["epochs"], point, yerr=[lo, hi], color=colours[pe], marker="o", ms=4, capsize=3,
                        label=f"{pe} (n={', '.join(stats.seeds_text(x) for x in n)})")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.minorticks_off()
        rungs = sorted(set(g["epochs"])) if not g.empty else []
        ax.set_xticks(rungs, [str(e) for e in rungs])  # the rungs themselves (none: no ticks)
        ax.set_xlabel("training budget, epochs (each rung fully decayed)")
        ax.set_title(f"softmax − {label}, each with the same encoding", fontsize=10)
        ax.grid(True, alpha=0.3)
        if rungs:
            ax.legend(fontsize=7, loc="upper right")
        else:
            ax.text(0.5, 0.5, "no encoding's two cells hold every seed yet", ha="center", va="center",
                    transform=ax.transAxes)
    np.atleast_1d(axes)[0].set_ylabel("gap, points of judged accuracy\n(mean difference, 95% Welch interval)")
    fig.suptitle(f"CIFAR-10 ({h.study}): the softmax / linear-attention gap per encoding against budget "
                 f"({h.devices})", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path)


def table(h: Headline, backends: tuple[str, ...] = tuple(BACKENDS)) -> str:
    """At most 12 rows: backend x RPE at the backend's longest complete rung, both metrics."""
    rows = []
    for backend in backends:
        label = BACKENDS[backend]
        rung = h.longest_complete(backend)
        if rung is None:
            have = max((r.epochs for r in h.rungs.get(backend, [])), default=None)
            rows.append([label, "—", "no complete rung yet" + (f" (rows up to {have} epochs)" if have else ""),
                         "", "", "", ""])
            continue
        for pe, p, q in zip(RPES, rung.primary, rung.secondary):
            declared = h.declared.get(backend, False)
            rows.append([label, pe, str(rung.epochs), p.holm.text(), _verdict(p, h.n, declared), q.holm.text(),
                         _verdict(q, h.n, declared)])
    return markdown_table(["linear backend", "RPE", "rung (epochs)", "gap(ape) − gap(RPE), judged: at its Holm level",
                           "verdict", "the same on the training draw", "verdict"], rows)


def _verdict(o: confirmatory.Outcome, n: int, declared: bool) -> str:
    """A declared contrast's verdict; an exploratory one only says where its interval lies (the family was
    chosen after the data were seen). A positive contrast is a smaller signed gap with the RPE: "narrows" while
    that gap is not negative; "reverses" only where the gap with the RPE (confirmatory.Outcome.gaps, Welch) is
    below 0 with its 95% interval, the linear backend ahead; where only its point is below 0, "narrows" and says
    that its sign is not resolved (a point below 0 is not a reversal: an independent review)."""
    if not o.complete:
        return o.verdict(n)
    if not o.resolved:
        return f"not resolved with {stats.seeds_text(o.holm.n)}"
    with_rpe = o.gaps[1] if len(o.gaps) == 2 else None
    if o.holm.point <= 0:
        direction, note = "widens the gap", ""
    elif with_rpe is not None and with_rpe.hi < 0:
        direction, note = "reverses the gap", "with the RPE the linear backend is ahead, 95% Welch"
    else:
        direction = "narrows the gap"
        note = ("with the RPE the gap's sign is not resolved: its 95% interval includes 0"
                if with_rpe is not None and with_rpe.point < 0 else "")
    if declared:
        return direction + (f" ({note})" if note else "")
    return f"excludes 0 (exploratory: {direction.split()[0]}{f'; {note}' if note else ''})"


def readme_lines(h: Headline | None, figure_link: str) -> list[str]:
    """The README's answer: one sentence, the figure, the table."""
    if h is None:
        return ["No CIFAR-10 budget ladder is published yet."]
    kind = {b: "declared before the run (confirmatory)" if d else "exploratory: not declared by the study"
            for b, d in h.declared.items()}
    kinds = sorted(set(kind.values()))
    return [f"**Does a relative encoding narrow the softmax / linear-attention gap on CIFAR-10?** From "
            f"{code_span(h.study)} ({h.n} seeds per cell at each rung shown; judged accuracy: the mean over {h.draws} for a random-feature "
            f"model; the training draw beside it): the contrast gap(ape) − gap(RPE) is positive where the RPE narrows the gap; "
            f"each at its Holm level over its backend's {len(RPES)} contrasts (Welch-Satterthwaite); "
            + "; ".join(kinds) + ".", "",
            f"![the softmax / linear gap per encoding against budget]({figure_link})", "", table(h),
            *([""] + [budget_note(h)] if budget_note(h) else []), *earlier_lines(h)]


def earlier_lines(h: Headline) -> list[str]:
    """Per backend without a complete rung in the study shown: the newest complete answer of an older study, its
    own n and whether declared, so the README does not read as if there were no answer for that backend."""
    out = []
    for backend, old in h.earlier.items():
        rung = old.longest_complete(backend)
        kind = ("declared before the run (confirmatory)" if old.declared.get(backend) else
                "exploratory: not declared by the study")
        out += ["", f"{BACKENDS[backend]} has no complete rung in {code_span(h.study)} yet; its newest complete answer "
                    f"is {code_span(old.study)}'s at {rung.epochs} epochs ({old.n} seeds per cell; {kind}):", "",
                table(old, (backend,))]
    return out


def budget_note(h: Headline) -> str:
    """The table shows each backend's longest complete rung; the contrasts whose verdict on the judged accuracy
    is another at a shorter complete rung, in one sentence, so the table is not read as the answer at every
    budget: "At shorter budgets the verdict differs: FAVOR+ luo_rpe at 5 epochs 2.9 [0.923, 4.88] (...): excludes
    0 (exploratory: narrows); ..." ("" where none differs)."""
    differ = []
    for backend, label in BACKENDS.items():
        longest = h.longest_complete(backend)
        if longest is None:
            continue
        declared = h.declared.get(backend, False)
        for rung in h.rungs.get(backend, []):
            if rung.epochs >= longest.epochs or not rung.complete:
                continue
            for pe, o, last in zip(RPES, rung.primary, longest.primary):
                if _verdict(o, h.n, declared) != _verdict(last, h.n, declared):
                    differ.append(f"{label} {pe} at {rung.epochs} epochs {o.holm.text()}: {_verdict(o, h.n, declared)}")
    if not differ:
        return ""
    return ("At shorter budgets of the same study the verdict differs (each rung is judged on its own: no declared "
            "test compares a contrast across budgets; judged accuracy, at its Holm level): " + "; ".join(differ) + ".")


__all__ = ["FIGURE", "HEADLINE_STUDIES", "Headline", "budget_note", "figure", "headline", "readme_lines", "table"]
