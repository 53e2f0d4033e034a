"""Shared helpers of the analysis scripts: load sweep results, bootstrap intervals, Markdown, figures.

RESULTS_DIR is either one sweep folder (holding trials.parquet) or a parent folder holding several
`<name>/trials.parquet`; every script accepts both and writes its Markdown and PNGs into RESULTS_DIR.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from rpevit.sweep.results import OK, TRIALS_FILE

ENVIRONMENT_COLUMNS = ("device_name", "torch_version", "ray_version", "git_commit", "python_version")


def trial_files(results_dir: Path) -> list[Path]:
    """trials.parquet of one sweep folder, or of every sweep folder directly under a parent."""
    results_dir = Path(results_dir)
    if (results_dir / TRIALS_FILE).exists():
        return [results_dir / TRIALS_FILE]
    return sorted(results_dir.glob(f"*/{TRIALS_FILE}"))


def load_trials(results_dir: Path, task: str | None = None) -> pd.DataFrame:
    """Successful trial rows (status ok) of every sweep found, optionally of one task; empty if none."""
    files = trial_files(results_dir)
    frames = [pd.read_parquet(f) for f in files]
    if not frames:
        return pd.DataFrame()
    frame = pd.concat(frames, ignore_index=True, sort=False)
    frame = frame[frame["status"] == OK]
    if task is not None:
        frame = frame[frame["task"] == task] if "task" in frame.columns else frame.iloc[0:0]
    return frame.reset_index(drop=True)


def bootstrap(groups: Sequence[np.ndarray], statistic: Callable[..., float], *, n_boot: int = 4000,
              level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(point estimate, lower, upper) of statistic(*groups), percentile interval from resampling
    each group's values (seeds) independently with replacement. (nan, nan) interval if any group
    has a single value: one seed carries no information about seed-to-seed spread."""
    groups = [np.asarray(g, dtype=float) for g in groups]
    point = statistic(*groups)
    if any(len(g) < 2 for g in groups):
        return point, math.nan, math.nan
    rng = np.random.default_rng(seed)
    draws = np.array([statistic(*(g[rng.integers(0, len(g), len(g))] for g in groups)) for _ in range(n_boot)])
    draws = draws[np.isfinite(draws)]
    if len(draws) == 0:
        return point, math.nan, math.nan
    alpha = (1 - level) / 2
    return point, float(np.quantile(draws, alpha)), float(np.quantile(draws, 1 - alpha))


def fmt(value: Any, digits: int = 4) -> str:
    """Numbers to `digits` significant figures; NaN as an em dash."""
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            return "—"
        return f"{value:.{digits}g}"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return str(value)


def interval(point: float, lo: float, hi: float, digits: int = 3, scale: float = 1.0) -> str:
    """'point [lo, hi]', or 'point (no interval)' when the interval is undefined."""
    if not math.isfinite(point):
        return "—"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{fmt(point * scale, digits)} (no interval)"
    return f"{fmt(point * scale, digits)} [{fmt(lo * scale, digits)}, {fmt(hi * scale, digits)}]"


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A pipe table; '|' inside cells (norms like |x|) is escaped so it cannot split a column."""
    cell = lambda c: fmt(c).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(cell, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines)


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend (no display on the machines that run this)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path


def environment_table(frame: pd.DataFrame) -> str:
    """Where the rows were produced: each distinct (device, torch, ray, commit, python) with its row count."""
    cols = [c for c in ENVIRONMENT_COLUMNS if c in frame.columns]
    if frame.empty or not cols:
        return "_no environment columns in the results_"
    groups = frame.groupby(cols, dropna=False).size().reset_index(name="rows")
    if "sweep" in frame.columns:
        sweeps = frame.groupby(cols, dropna=False)["sweep"].agg(lambda s: ", ".join(sorted(set(map(str, s)))))
        groups["sweeps"] = sweeps.values
    return markdown_table(list(groups.columns), groups.itertuples(index=False))


def cli(description: str) -> Path:
    """The RESULTS_DIR argument every script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("results_dir", type=Path, help="a sweep folder, or a parent of several")
    results_dir = parser.parse_args().results_dir
    if not trial_files(results_dir):
        parser.error(f"RESULTS_DIR {results_dir} holds no {TRIALS_FILE} (nor */{TRIALS_FILE})")
    return results_dir


def write_markdown(path: Path, text: str) -> Path:
    path.write_text(text.rstrip() + "\n")
    print(f"wrote {path}")
    return path


def script_main(doc: str, build: Callable[[Path], "str | None"], out_name: str, title: str, what: str) -> None:
    """The body of every analysis script: RESULTS_DIR -> build(...) -> <RESULTS_DIR>/<out_name>."""
    results_dir = cli(doc.splitlines()[0])
    text = build(results_dir)
    if text is None:
        raise SystemExit(f"no successful {what} under {results_dir}")
    write_markdown(results_dir / out_name, f"# {title}\n\n" + text)
