"""The accuracy-vs-cost figure of efficiency: each variant at its judged accuracy against each cost, the
Pareto front ringed and named. Colour: the backend's (rpevit.analysis.variants, the one colour map),
with a legend entry for every backend drawn; marker: the encoding, one per encoding in the figure.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from rpevit.analysis import variants
from rpevit.analysis.common import attention_class, column, fmt, pyplot, save_figure
from rpevit.attention.base import RandomFeatureBackend
from rpevit.analysis.efficiency.compute import (BENCH_TIMING, CONTENDED, JUDGED_ACC, JUDGED_HI, JUDGED_LO,
                                                MULTIPLY_ADDS, ONE_AT_A_TIME, TIME_COLUMNS, UNKNOWN_TIMES,
                                                pareto_front, time_devices)

MIN_ACC_SPAN = 1.0  # accuracy points: the shortest accuracy axis, so one point (or a tight cluster) is not magnified
PARETO_Y_SPAN = 5.0  # accuracy points shown below the best; variants further down sit at the edge as ▼
LOG_AXIS_MIN_RATIO = 10.0  # a cost spanning less than this factor is drawn on a linear axis (readable ticks)
PARETO_COSTS = (("flops", MULTIPLY_ADDS), ("train_s_per_epoch", "train s / epoch"),
                ("infer_ms_per_sample", "inference ms / sample"))
# a panel's title names its cost briefly (the title also carries the front's names); the axis label says it all
PARETO_TITLES = {"flops": "multiply-adds"}
PE_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p", "d", "H", "8")  # by the figure's encodings
MARKER_SIZE = 55  # points^2: about 7.5 pt across
DODGE_PT = 8.0  # markers closer than this (points) on the page are set side by side, DODGE_PT apart
FONT = {"tick": 9, "label": 10, "title": 10, "note": 8}

CONTENDED_MARK = "†"  # beside a point whose time is the sweep's own (contended) among bench times


def pe_family(pe: str) -> str:
    """The encoding without its variant options: 'sparse_cayley_string (string_sparsity=0.1, ...)' -> its name."""
    return pe.split(" (")[0]


def short_label(r: pd.Series) -> str:
    """A point's name on the plot: attention+pe, with f (and a sparse solve) for sparse Cayley, qk l2 and
    'no redraw' where they apply."""
    parts = [f"{r['attention']}+{pe_family(r['pe'])}"]
    if "string_sparsity=" in r["pe"]:
        parts.append("f=" + r["pe"].split("string_sparsity=")[1].split(",")[0].rstrip(")"))
    parts += ["sparse solve"] * ("cayley_solver=sparse" in r["pe"])
    parts += ["qk l2"] * (r["qk_norm"] != "none") + ["no redraw"] * not_redrawn(r)
    return " ".join(parts)


def not_redrawn(r: pd.Series) -> bool:
    """A random-feature variant trained on one draw (redraw off): its backend a RandomFeatureBackend (a one-file
    backend too, not only favor and relu by name), still drawing (with_variant renamed one configured not to
    draw, e.g. 'relu-identity', whose 'off' means nothing to redraw)."""
    cls = attention_class(r["attention"])
    return isinstance(cls, type) and issubclass(cls, RandomFeatureBackend) and r["redraw"] == "off"


def dodge(points: np.ndarray, step: float = DODGE_PT, bounds: tuple[float, float, float, float] | None = None
          ) -> np.ndarray:
    """(dx, dy) offsets (page points, as `points`) that set markers which would cover each other around their
    spot: each point takes the nearest free place of a hexagonal ring pattern (0; 6 places at `step`; 12 at
    2 step; ...; sideways places before vertical ones) that keeps it `step` from every point placed before
    it and inside `bounds` (x0, y0, x1, y1: the axes less a marker's half width), so coincident points form
    a small cluster where they are and none is pushed onto an axis edge. Points already apart keep offset 0."""
    rings = [(0.0, 0.0)]
    for ring in range(1, 8):
        rings += [(ring * step * math.cos(a), ring * step * math.sin(a))
                  for a in np.linspace(0, 2 * math.pi, 6 * ring, endpoint=False)]
    rings.sort(key=lambda d: d[0] ** 2 + 4 * d[1] ** 2)  # sideways first: an accuracy axis may be short
    offsets = np.zeros((len(points), 2))
    placed: list[np.ndarray] = []
    for i, point in enumerate(points):
        if not np.isfinite(point).all():
            continue
        for dx, dy in rings:
            candidate = point + (dx, dy)
            if bounds is not None and (dx or dy) and not (bounds[0] <= candidate[0] <= bounds[2]
                                                          and bounds[1] <= candidate[1] <= bounds[3]):
                continue
            if all(math.hypot(*(candidate - other)) >= step * 0.999 for other in placed):
                offsets[i] = (dx, dy)
                break
        placed.append(point + offsets[i])
    return offsets


@dataclass
class Panel:
    """One dataset's accuracy against one cost: the main axes, the strip of collapsed variants under it, the
    dataset's variants `g` with their cost and accuracy, which are drawn (`shown`), which sit in the strip
    (`low`), and which carry CONTENDED_MARK (`marked`)."""

    ax: object
    strip: object
    g: pd.DataFrame
    cost: np.ndarray
    acc: np.ndarray
    shown: np.ndarray
    low: np.ndarray
    marked: np.ndarray


def pareto_title(costs: pd.DataFrame) -> str:
    """The figure's suptitle: the devices its times ran on (compute.time_devices of the variants plotted)."""
    return f"Accuracy against cost; times on {time_devices(costs)}"


def plot_pareto(costs: pd.DataFrame, path: Path) -> Path | None:
    """One panel per dataset and cost that has positive values; accuracy is JUDGED_ACC, so a random-feature
    model sits at its mean over fresh draws; log cost axes where the cost spans LOG_AXIS_MIN_RATIO or more.
    Colour: attention; marker: encoding; light face: qk_norm l2; black rim: random features never redrawn.
    The accuracy axis spans PARETO_Y_SPAN points below the best, so a collapsed variant (a redraw-off model on
    fresh draws: 20-30 %) does not squash the front: such variants are drawn at their own accuracy in a strip
    below (a broken axis), none on an axis edge. Markers that would cover each other are set side by side
    (`dodge`: an offset of a marker width on the page, not a change of cost); the Pareto front is ringed,
    joined and labelled. None if no cost has any values."""
    metrics = [(c, label) for c, label in PARETO_COSTS if c in costs.columns and (costs[c] > 0).any()]
    if not metrics:
        return None
    plt = pyplot()
    datasets = sorted(costs["dataset"].unique())
    families = sorted({pe_family(pe) for pe in costs["pe"]})
    markers = {f: PE_MARKERS[i % len(PE_MARKERS)] for i, f in enumerate(families)}
    fig = plt.figure(figsize=(4.4 * len(metrics), 5.2 * len(datasets) + 1.2), layout="constrained")
    grid = fig.add_gridspec(2 * len(datasets), len(metrics), height_ratios=[4, 1.2] * len(datasets))
    panels = [panel for d, dataset in enumerate(datasets)
              for panel in dataset_panels(fig, grid, d, dataset, costs[costs["dataset"] == dataset], metrics)]
    whiskers = JUDGED_LO in costs and bool(np.isfinite(costs[JUDGED_LO].to_numpy(float)).any())
    colours = variants.colours(variants.ATTENTION, costs["attention"])
    fig.legend(handles=pareto_legend(costs, colours, markers, families, whiskers=whiskers,
                                     marked=any(panel.marked.any() for panel in panels)),
               loc="outside lower center", ncol=4, fontsize=FONT["tick"], frameon=False)
    fig.suptitle(pareto_title(costs), fontsize=FONT["title"])
    fig.draw_without_rendering()  # the layout is final: page positions for the dodge
    for panel in panels:
        mark_front(fig, panel, draw_points(fig, panel, colours, markers))
    return save_figure(fig, path)


def dataset_panels(fig, grid, d: int, dataset: str, g: pd.DataFrame, metrics: list[tuple[str, str]]) -> list[Panel]:
    """Row d of the figure: one dataset's accuracy against each cost (a panel without any point says so and
    is not returned). The accuracy axis is shared: PARETO_Y_SPAN points below the best, the rest in strips."""
    g = g.reset_index(drop=True)
    acc = 100 * g[JUDGED_ACC].to_numpy(float)
    whiskers = 100 * g[[JUDGED_LO, JUDGED_HI]].to_numpy(float) if JUDGED_LO in g else np.full((len(g), 2), np.nan)
    top = np.nanmax(acc) if np.isfinite(acc).any() else math.nan
    floor = np.nanmin(acc[acc >= top - PARETO_Y_SPAN]) if math.isfinite(top) else math.nan  # lowest near the best
    low = acc < floor
    y_range = accuracy_range(acc[~low], whiskers[~low])
    panels = []
    for m, (col, label) in enumerate(metrics):
        ax = fig.add_subplot(grid[2 * d, m])
        strip = fig.add_subplot(grid[2 * d + 1, m], sharex=ax)
        cost = g[col].to_numpy(float)
        shown = np.isfinite(cost) & (cost > 0) & np.isfinite(acc)
        ax.set_title(f"{dataset}: accuracy against {PARETO_TITLES.get(col, label)}", fontsize=FONT["title"])
        if not shown.any():  # nothing to place: say so inside the panel
            ax.text(0.5, 0.5, textwrap.fill(f"no {label} with an accuracy", 40), ha="center", va="center",
                    transform=ax.transAxes, fontsize=FONT["note"])
            strip.set_visible(False)
            continue
        log = set_cost_axis(ax, cost[shown])
        ax.set_ylim(*y_range)
        label, marked = axis_label(label, col, column(g, "timing", ""), shown)
        ax.tick_params(labelsize=FONT["tick"])
        strip.tick_params(labelsize=FONT["tick"])
        if m == 0:
            ax.set_ylabel("test accuracy %\n(draw mean for random features)", fontsize=FONT["label"])
        xlabel = textwrap.fill(f"{label}{' (log)' if log else ''}", 48)
        if (low & shown).any():
            break_accuracy_axis(ax, strip, accuracy_range(acc[low & shown], whiskers[low & shown], fraction=0.25,
                                                          least=2.0), xlabel, first=m == 0)
        else:
            strip.set_visible(False)
            ax.set_xlabel(xlabel, fontsize=FONT["label"])
        panels.append(Panel(ax, strip, g, cost, acc, shown, low, marked))
    return panels


def set_cost_axis(ax, positive: np.ndarray) -> bool:
    """A log cost axis where the costs span LOG_AXIS_MIN_RATIO or more (True), else a linear one, each
    padded so no marker sits on an edge."""
    log = positive.max() / positive.min() >= LOG_AXIS_MIN_RATIO
    ax.set_xscale("log" if log else "linear")
    if log:
        ax.set_xlim(positive.min() / 1.25, positive.max() * 1.25)
    else:
        span = max(positive.max() - positive.min(), 0.05 * positive.max())
        ax.set_xlim(positive.min() - 0.08 * span, positive.max() + 0.08 * span)
    return log


def break_accuracy_axis(ax, strip, strip_range: tuple[float, float], xlabel: str, *, first: bool) -> None:
    """The strip under a panel holds the variants more than PARETO_Y_SPAN points below the best: a broken
    accuracy axis, marked by dashed lines where it breaks; the cost label moves under the strip."""
    strip.set_ylim(*strip_range)
    ax.spines["bottom"].set_visible(False)
    strip.spines["top"].set_visible(False)
    ax.tick_params(axis="x", which="both", bottom=False, labelbottom=False)
    for axis, y in ((ax, 0), (strip, 1)):  # the break marks of the broken accuracy axis
        axis.plot([0, 1], [y, y], transform=axis.transAxes, ls=(0, (4, 3)), color="0.5", lw=0.8, clip_on=False)
    strip.set_xlabel(xlabel, fontsize=FONT["label"])
    if first:
        strip.set_ylabel(f"more than {fmt(PARETO_Y_SPAN)}\npoints below", fontsize=FONT["note"])


def draw_points(fig, panel: Panel, colours: dict[str, str], markers: dict[str, str]) -> dict[int, np.ndarray]:
    """Each shown variant of a panel, in the main axes or the strip, dodged off its neighbours (page points),
    with its whiskers and mark; returns each point's dodge offset."""
    from matplotlib.colors import to_rgb
    from matplotlib.transforms import offset_copy

    moved: dict[int, np.ndarray] = {}  # point -> its dodge offset (page points)
    for axis, rows in ((panel.ax, panel.shown & ~panel.low), (panel.strip, panel.shown & panel.low)):
        idx = np.flatnonzero(rows)
        if not len(idx):
            continue
        page = axis.transData.transform(np.column_stack([panel.cost[idx], panel.acc[idx]])) * 72 / fig.dpi
        box = axis.get_window_extent()
        half = DODGE_PT / 2
        bounds = (box.x0 * 72 / fig.dpi + half, box.y0 * 72 / fig.dpi + half, box.x1 * 72 / fig.dpi - half,
                  box.y1 * 72 / fig.dpi - half)
        offsets = dict(zip(idx, dodge(page, bounds=bounds)))
        moved.update(offsets)
        for i in idx:
            r, x, y = panel.g.loc[i], panel.cost[i], panel.acc[i]
            colour = colours[r["attention"]]
            where = offset_copy(axis.transData, fig=fig, x=offsets[i][0], y=offsets[i][1], units="points")
            face = colour if r["qk_norm"] == "none" else (*to_rgb(colour), 0.2)
            axis.scatter(x, y, s=MARKER_SIZE, marker=markers[pe_family(r["pe"])], transform=where,
                         facecolors=[face], edgecolors="k" if not_redrawn(r) else colour,
                         linewidths=1.8 if not_redrawn(r) else 1.0, zorder=3)
            lo, hi = (100 * r.get(JUDGED_LO, math.nan), 100 * r.get(JUDGED_HI, math.nan))
            if math.isfinite(lo) and math.isfinite(hi):  # the seeds' 95% t interval of the accuracy
                axis.errorbar(x, y, yerr=[[y - lo], [hi - y]], fmt="none", ecolor=colour, elinewidth=0.9,
                              capsize=2.5, transform=where, zorder=2)
            if panel.marked[i]:  # a contended time beside times measured alone
                axis.annotate(CONTENDED_MARK, (x, y), xycoords=where, xytext=(5, -3), textcoords="offset points",
                              fontsize=FONT["note"], zorder=5)
    return moved


def mark_front(fig, panel: Panel, moved: dict[int, np.ndarray]) -> None:
    """The panel's Pareto front: numbered rings on its points (where they were dodged to), their names under
    the panel's title, a dashed line joining those in the main axes."""
    from matplotlib.transforms import offset_copy

    cost, acc = panel.cost, panel.acc
    front = pareto_front(np.where(panel.shown, cost, np.nan), acc)
    on_front = np.flatnonzero(front)
    on_front = on_front[np.argsort(cost[on_front])]
    for number, i in enumerate(on_front, 1):  # numbered rings; the names go under the panel's title
        axis = panel.strip if panel.low[i] else panel.ax
        where = offset_copy(axis.transData, fig=fig, x=moved[i][0], y=moved[i][1], units="points")
        axis.scatter(cost[i], acc[i], s=3.2 * MARKER_SIZE, facecolors="none", edgecolors="k", transform=where,
                     zorder=4)
        axis.annotate(str(number), (cost[i], acc[i]), xycoords=where, xytext=(0, 7), textcoords="offset points",
                      ha="center", va="bottom", fontsize=FONT["note"], fontweight="bold", zorder=5)
    names = [f"{n} {short_label(panel.g.loc[i])}" for n, i in enumerate(on_front, 1)]
    panel.ax.set_title(panel.ax.get_title() + "\n" + textwrap.fill("Pareto front: " + ", ".join(names), 62),
                       fontsize=FONT["title"])
    order = np.flatnonzero(front & ~panel.low)
    order = order[np.argsort(cost[order])]
    panel.ax.plot(cost[order], acc[order], "k--", lw=0.8, zorder=2)

def accuracy_range(acc: np.ndarray, whiskers: np.ndarray, fraction: float = 0.08,
                   least: float = 0.0) -> tuple[float, float]:
    """An accuracy axis (points) holding every accuracy and its whiskers within 0-100 (a t interval of
    two seeds can reach past them: its whisker runs off the axis), at least MIN_ACC_SPAN long, so a single
    point or a tight cluster is not magnified into a difference; padded by `fraction` of its span, at
    least `least` points, so no marker sits on an edge."""
    values = np.concatenate([acc[np.isfinite(acc)], whiskers[np.isfinite(whiskers)]])
    if not len(values):
        return 0.0, 100.0
    lo, hi = max(0.0, float(values.min())), min(100.0, float(values.max()))  # a whisker past 0 or 100 runs off
    if hi - lo < MIN_ACC_SPAN:
        middle = (lo + hi) / 2
        lo, hi = middle - MIN_ACC_SPAN / 2, middle + MIN_ACC_SPAN / 2
    margin = max(least, fraction * (hi - lo))
    return lo - margin, hi + margin


def axis_label(label: str, col: str, timing: pd.Series, shown: np.ndarray) -> tuple[str, np.ndarray]:
    """(the cost axis' label, which points to mark CONTENDED_MARK): a time says where it was measured:
    bench trials alone, or the sweep's own trials (contended when they ran side by side)."""
    none = np.zeros(len(timing), dtype=bool)
    kinds = set(timing[shown])
    if col not in TIME_COLUMNS or not kinds:
        return label, none
    if kinds == {BENCH_TIMING}:
        return f"{label} (bench trials, each alone)", none
    own = {CONTENDED: "contended: trials ran side by side, not comparable", ONE_AT_A_TIME: "one trial at a time",
           UNKNOWN_TIMES: "possibly contended"}
    if BENCH_TIMING not in kinds:
        return f"{label} (the sweep's own times, {'; '.join(own[k] for k in sorted(kinds))})", none
    return (f"{label} (bench alone; {CONTENDED_MARK} the sweep's own times, contended)",
            (timing != BENCH_TIMING).to_numpy(bool) & shown)


def pareto_legend(costs: pd.DataFrame, colours: dict[str, str], markers: dict[str, str], families: list[str], *,
                  whiskers: bool, marked: bool) -> list:
    """Legend entries for what the figure shows, nothing else: the attentions present (each in the colour it is
    drawn in, in their declared order: rpevit.analysis.variants) and the encodings present, qk_norm
    faces where both kinds are, the black rim where a variant never redrew, whiskers and marks if drawn."""
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], ls="", marker="o", ms=8, color=colours[a], label=variants.label(variants.ATTENTION, a))
               for a in variants.ordered(variants.ATTENTION, costs["attention"])]
    handles += [Line2D([], [], ls="", marker=markers[f], ms=8, color="0.35", label=f) for f in families]
    if set(costs["qk_norm"]) - {"none"}:
        handles += [Line2D([], [], ls="", marker="o", ms=8, markerfacecolor="0.35", markeredgecolor="0.35",
                           label="filled: qk_norm none")] * ("none" in set(costs["qk_norm"]))
        handles += [Line2D([], [], ls="", marker="o", ms=8, markerfacecolor="0.88", markeredgecolor="0.35",
                           label="light: qk_norm l2")]
    if any(not_redrawn(r) for _, r in costs.iterrows()):
        handles.append(Line2D([], [], ls="", marker="o", ms=8, markerfacecolor="0.35", markeredgecolor="k", mew=2,
                              label="black rim: features never redrawn"))
    if whiskers:
        handles.append(Line2D([], [], ls="-", marker="|", ms=6, color="0.35", lw=0.9,
                              label="whiskers: 95% t interval over seeds"))
    if marked:
        handles.append(Line2D([], [], ls="", marker=f"${CONTENDED_MARK}$", ms=7, color="k",
                              label="time measured beside other trials"))
    handles.append(Line2D([], [], ls="--", marker="o", ms=11, markerfacecolor="none", markeredgecolor="k", color="k",
                          lw=0.8, label="ringed, numbered: Pareto front (named above)"))
    return handles

