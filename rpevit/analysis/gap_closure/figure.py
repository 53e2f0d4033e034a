"""The gap-closure figure: G per Performer configuration and encoding, one panel per dataset, each encoding
in its colour of every figure (rpevit.analysis.variants), with a legend entry for each one drawn."""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

from rpevit.analysis import variants
from rpevit.analysis.common import fmt, pyplot, save_figure
from rpevit.analysis.gap_closure.compute import (DRAW_MEAN, GAP_OUTCOME, MIN_GAP, SHORT, TRAIN_DRAW, Assessment,
                                                 Config, G_exploratory)
from rpevit.analysis.stats import Interval

G_AXIS_LIMIT = 5.0
FONT = {"tick": 9, "label": 10, "title": 11, "note": 8}  # points; the figure is ~13 in wide, shown at page width
# A G whose gap is not resolved at its Holm level (compute.EXPLORATORY_G): an outline, dashed, never a filled bar.
EXPLORATORY_LEGEND = "dashed outline: G at 95% only (exploratory; the gap is not resolved at its Holm level)"
EXPLORATORY_NOTE = "G exploratory: gap not resolved at its Holm level"


def interval_caption(intervals: list[Interval]) -> str:
    """What the whiskers are, with the seed counts n of the groups behind them; no whiskers with one seed;
    no bars at all: why (the notes under the configurations say it for each)."""
    bounded = [iv for iv in intervals if iv.bounded]
    counts = sorted({k for iv in bounded for k in iv.n})
    if not intervals:
        return "no G bar: no configuration has a finite G on either accuracy (why: under each configuration)"
    if not bounded:
        return "no whiskers: fewer than 2 seeds in a group, so no interval"
    n = f"{counts[0]}" if counts[0] == counts[-1] else f"{counts[0]}–{counts[-1]}"
    missing = " (none where a group has fewer than 2 seeds)" if len(bounded) < len(intervals) else ""
    return (f"whiskers: 95% Fieller interval of G, per comparison (not Holm-adjusted), n = {n} seeds per group"
            f"{missing}")


def gap_closure_title(drawn: list[Interval], devices: str) -> str:
    """The figure's suptitle: what its whiskers are (interval_caption) and the devices of its rows
    (common.devices_text)."""
    return f"{interval_caption(drawn)}\n{devices}"


def plot_gap_closure(assessed: dict[str, dict[Config, Assessment]], path: Path,
                     devices: str = "device unknown") -> Path:
    """Bars of G per configuration and pe, one panel per dataset (stacked): draw mean solid, training draw
    hatched, with 95% Fieller intervals where every group has 2 or more seeds (the caption says so, with
    n). A configuration whose gap gives no G on an accuracy gets one note saying why inside its slot
    instead of a bar per encoding; a single missing G is marked 'n/a', and a G whose interval is
    unbounded (the gap not resolved at 95%) 'unbounded', without a bar: no finite bar could stand for
    it. A G whose gap is not resolved at its Holm level is drawn as a dashed outline, not a filled bar, and
    named so in its slot and the legend (the table's EXPLORATORY_G). The axis holds 0, 1 and every bar
    with its whiskers (g_axis_range), but stops at +-G_AXIS_LIMIT, so one tiny gap's huge interval does
    not flatten every other bar; an interval end beyond it is written at the edge. Each encoding has its
    colour of every figure (rpevit.analysis.variants); the legend names only what is drawn. Everything is
    drawn inside the axes. The title names `devices` (common.devices_text of the rows assessed)."""
    plt = pyplot()
    datasets = sorted({c[0] for c in assessed[TRAIN_DRAW]})
    fig, axes = plt.subplots(len(datasets), 1, figsize=(13, 4.8 * len(datasets)), squeeze=False, layout="constrained")
    drawn: list[Interval] = []
    kinds: set[tuple[str, str, bool]] = set()  # (metric, pe, exploratory) of every bar drawn: the legend's entries
    colours = variants.colours(variants.PE, (pe for a in assessed[TRAIN_DRAW].values() for pe in a.closures))
    for ax, dataset in zip(axes[:, 0], datasets):
        draw_dataset(ax, dataset, assessed, colours, drawn, kinds)
    handles = gap_legend(kinds, colours)
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), fontsize=FONT["tick"],
                   frameon=False)
    fig.suptitle(gap_closure_title(drawn, devices), fontsize=FONT["label"])
    return save_figure(fig, path)


def draw_dataset(ax, dataset: str, assessed: dict[str, dict[Config, Assessment]], colours: dict[str, str],
                 drawn: list[Interval], kinds: set[tuple[str, str, bool]]) -> None:
    """One dataset's panel: a slot per configuration, its axis fitted to the bars drawn in it (added to
    `drawn`, their (metric, pe, exploratory) to `kinds`)."""
    configs = [c for c in assessed[TRAIN_DRAW] if c[0] == dataset]
    ax.set_xlim(-0.5, len(configs) - 0.5)
    in_panel = len(drawn)
    pes = sorted({pe for c in configs for pe in assessed[TRAIN_DRAW][c].closures})
    ticks = [draw_configuration(ax, i, config, assessed, pes, colours, drawn, kinds)
             for i, config in enumerate(configs)]
    ax.set_ylim(*g_axis_range(drawn[in_panel:]))
    ax.axhline(0, color="k", lw=0.8)
    ax.axhline(1, color="k", lw=0.8, ls="--")
    ax.set_xticks(range(len(configs)), ticks, fontsize=FONT["tick"])
    ax.tick_params(axis="y", labelsize=FONT["tick"])
    ax.set_ylabel("gap closure G\n(1 = softmax+ape reached, 0 = b+ape)", fontsize=FONT["label"])
    ax.set_title(f"{dataset}: G of each Performer configuration b and encoding pe", fontsize=FONT["title"])


def draw_configuration(ax, i: int, config: Config, assessed: dict[str, dict[Config, Assessment]], pes: list[str],
                       colours: dict[str, str], drawn: list[Interval], kinds: set[tuple[str, str, bool]]) -> str:
    """Slot i: each encoding's G bar on the draw mean (solid) and the training draw (hatched), or a note on an
    accuracy without any, or on one whose bars are exploratory; returns the slot's tick label (the
    configuration and its notes)."""
    width = 0.8 / max(1, 2 * len(pes))
    notes = []
    for k, (metric, hatch) in enumerate(((DRAW_MEAN, None), (TRAIN_DRAW, "//"))):
        assessment = assessed[metric][config]
        closures = assessment.closures
        if not any(math.isfinite(c.G.point) and not c.G.unbounded for c in closures.values()):
            notes.append(f"{SHORT[metric]}: {no_G_reason(assessment, config[1])}")
            continue
        exploratory = any(G_exploratory(assessment.gap, c.G) for c in closures.values())
        if exploratory:
            notes.append(f"{SHORT[metric]}: {EXPLORATORY_NOTE}")
        for j, pe in enumerate(pes):
            if pe not in closures:
                continue
            xpos = i + (2 * j + k - (2 * len(pes) - 1) / 2) * width
            if draw_bar(ax, xpos, width, closures[pe].G, colours[pe], hatch, None, exploratory):
                drawn.append(closures[pe].G)
                kinds.add((metric, pe, exploratory))
    _, b, q, r = config
    return "\n".join([b, f"qk_norm {q}", f"redraw {r}".replace(" until", "\nuntil"),
                      *(line for note in notes for line in textwrap.wrap(f"[{note}]", 24))])


def gap_legend(kinds: set[tuple[str, str, bool]], colours: dict[str, str]) -> list:
    """A legend entry per encoding drawn (its colour and label: rpevit.analysis.variants), the hatching
    of each accuracy drawn, and the dashed outline of an exploratory G where one is drawn."""
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=colours[pe], label=variants.label(variants.PE, pe))
               for pe in sorted({pe for _, pe, _ in kinds})]
    handles += [Patch(facecolor="white", edgecolor="k", label="solid: draw mean (judged)")] * any(
        k[0] == DRAW_MEAN for k in kinds)
    handles += [Patch(facecolor="white", edgecolor="k", hatch="//", label="hatched: training draw")] * any(
        k[0] == TRAIN_DRAW for k in kinds)
    handles += [Patch(facecolor="none", edgecolor="k", linestyle="--", label=EXPLORATORY_LEGEND)] * any(
        k[2] for k in kinds)
    return handles


def g_axis_range(bars: list[Interval]) -> tuple[float, float]:
    """The G axis of a panel: 0 and 1 (the two reference lines) and each bar with its finite whisker ends,
    within +-G_AXIS_LIMIT, padded by 10% where not cut there: a small G with a small interval is readable,
    not a flat line."""
    values = [0.0, 1.0] + [v for iv in bars for v in (iv.point, iv.lo, iv.hi) if math.isfinite(v)]
    lo, hi = max(min(values), -G_AXIS_LIMIT), min(max(values), G_AXIS_LIMIT)
    pad = 0.1 * (hi - lo)
    # a side cut at the limit ends there, where draw_bar writes the whisker's true end
    return lo - pad * (lo > -G_AXIS_LIMIT), hi + pad * (hi < G_AXIS_LIMIT)


def no_G_reason(assessment: Assessment, backend: str) -> str:
    """Why a configuration shows no G bar on an accuracy, in a few words (from the gap's state)."""
    gap = assessment.gap
    if gap.state == "missing":
        return "no G, " + (gap.why.split(" (")[0] or "not measured")
    if gap.state == "one seed":
        return f"no G, one seed and a gap below {fmt(100 * MIN_GAP)} points"
    if any(c.G.unbounded for c in assessment.closures.values()):
        return "G unbounded: gap not resolved at 95%"
    return "no G, " + GAP_OUTCOME[gap.state].format(backend=backend)


def draw_bar(ax, xpos: float, width: float, G: Interval, color: str, hatch: str | None, label: str | None,
             exploratory: bool = False) -> bool:
    """One G bar with its interval, or an 'n/a' / 'unbounded' label; True if a bar (and so its legend label)
    was drawn. Whiskers only for a bounded interval (every group with 2 or more seeds). An exploratory G
    (its gap not resolved at its Holm level) is a dashed outline in its colour, not a filled bar."""
    if not math.isfinite(G.point) or G.unbounded:  # no G, or any G of either sign is compatible with the seeds
        ax.annotate("unbounded" if G.unbounded else "n/a", (xpos, 0.0), xytext=(0, 3), textcoords="offset points",
                    ha="center", va="bottom", fontsize=FONT["note"], rotation=90)  # just above 0, at any scale
        return False
    err = [[G.point - G.lo], [G.hi - G.point]] if G.bounded else None
    if exploratory:
        ax.bar(xpos, G.point, width, yerr=err, capsize=2, facecolor="none", edgecolor=color, linestyle="--",
               linewidth=1.5, hatch=hatch, label=label)
    else:
        ax.bar(xpos, G.point, width, yerr=err, capsize=2, color=color, hatch=hatch, alpha=0.6 if hatch else 1.0,
               label=label)
    for end in (G.lo, G.hi):
        if math.isfinite(end) and abs(end) > G_AXIS_LIMIT:
            ax.annotate(f"{end:.3g}", (xpos, math.copysign(G_AXIS_LIMIT, end)), xytext=(2, 0),
                        textcoords="offset points", ha="left", va="top" if end > 0 else "bottom",
                        fontsize=FONT["note"], rotation=90, annotation_clip=False)
    return True


