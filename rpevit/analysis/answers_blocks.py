"""The generated blocks of results/README.md and docs/*.md that rpevit.analysis.answers writes (the README's
"answers" block is answers.readme_block): each study folder's rows and the check of the provenance counts typed
beside them, which studies declared their comparisons, the CIFAR-10 pilots and step times, the GPU sweep as it
ran with its answers, bench and packing runs, the MNIST redraw table and each dataset's recipe."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from rpevit.analysis import continuation, efficiency, gap_closure, validation_choice
from rpevit.analysis.answers_cost import timing_text
from rpevit.analysis.answers_sources import (IN_PROGRESS, AnswersError, Sources, confirmatory_studies, configurations,
                                             is_published, status_of)
from rpevit.analysis.answers_validation import current_validation_folders
from rpevit.analysis.answers_wording import accuracy_of, configuration_lines, exploratory, percent
from rpevit.analysis.common import (code_span, column, current_rows, devices_text, fmt, markdown_table, md_text,
                                    read_epoch_times, read_sweep, read_text_file, read_trials, space_keys, with_variant,
                                    VARIANT)
from rpevit.analysis.gap_closure import DRAW_MEAN, TRAIN_DRAW
from rpevit.analysis.report import hours_running, thread_hours, time_span
from rpevit.analysis.stats import mean_interval
from rpevit.config import ConfigError, TrialConfig
from rpevit.sweep.protocol import FAILED, OK
from rpevit.sweep.results import TRIALS_FILE, unix_seconds
from rpevit.sweep.space import load_space


GPU_FOLDER, GPU_SWEEP, GPU_BENCH, GPU_PACKING = "gpu_h100", "all12_cifar10_gpu_4ep", "bench_cifar10_gpu", "packing"
PILOTS = "pilots"
PILOT_ALLOWED = "the JSON summary row the CLI prints (python -m rpevit.cli), a regular file"
PACKING_ALLOWED = "the JSON benchmarks/gpu_packing.py writes, a regular file"


# ---------------------------------------------------------------- provenance and tables for results/README.md
def folder_rows(results_dir: Path) -> list[dict]:
    """Per published sweep folder under results_dir (and one level below): its current rows' ok / failed counts,
    rows set aside, seeds, thread-hours in the trials and the commits the rows record. Studies still running
    (results/in_progress/) are left out: their rows change at every stop and are not published; so is every
    folder of one's own (published_folders: results/smoke/ of README command 1)."""
    out = []
    for path in sorted(results_dir.glob(f"*/{TRIALS_FILE}")) + sorted(results_dir.glob(f"*/*/{TRIALS_FILE}")):
        if path.relative_to(results_dir).parts[0] == IN_PROGRESS or not is_published(results_dir, path.parent):
            continue
        frame = read_sweep(path, path.parent)
        if frame is None or frame.empty:
            continue
        current, aside = current_rows(frame, path.parent)
        counts = current["status"].value_counts()
        out.append({"folder": path.parent.relative_to(results_dir).as_posix(),
                    "tasks": ", ".join(sorted(current["task"].dropna().astype(str).unique())),
                    OK: int(counts.get(OK, 0)), FAILED: int(counts.get(FAILED, 0)), "aside": aside,
                    "seeds": sorted(set(pd.to_numeric(current["seed"], errors="coerce").dropna().astype(int))),
                    "thread_hours": thread_hours(current, read_epoch_times(path.parent)),
                    "span": time_span(current), "running_hours": hours_running(current),
                    "resumed": int((pd.to_numeric(column(current, "resumed_from_epoch", 0), errors="coerce")
                                    > 0).sum()),
                    "commits": column(current, "git_commit", "").fillna("").astype(str).str[:7].value_counts()})
    return out


def declared_studies_block(sources: Sources) -> str:
    """results/README.md: which studies declared their comparisons before they ran (confirmatory) and
    which did not (exploratory), from the declaration.json files, so the sentence cannot go stale."""
    def names(folders: list[Path]) -> str:
        return ", ".join(code_span(f.relative_to(sources.results_dir).as_posix()) for f in folders)

    def redeclared(folders: list[Path]) -> str:
        return "; ".join(f"{names([f])} ({status_of(f)})" for f in folders)
    published = confirmatory_studies(sources.results_dir)
    running = confirmatory_studies(sources.results_dir, running=True)
    once = [f for f in published if not status_of(f)]
    again = [f for f in published if status_of(f)]
    text = ("Declared its comparisons before it ran, so confirmatory over exactly those (its `confirmatory.md`, "
            f"written by `python analysis/confirmatory.py results/<folder>`): {names(once)}." if once else "")
    if again:
        text += (f"{' ' if text else ''}Declared, then redeclared, so confirmatory only over the rows that started after "
                 f"its last declaration (every earlier row is exploratory; its `confirmatory.md` says what changed): "
                 f"{redeclared(again)}.")
    text += (" Every other study here declared none (`rpevit/sweep/declaration.py`), so every claim from it is "
             "exploratory." if published else "None of the studies here declared its comparisons before it ran "
             "(`rpevit/sweep/declaration.py`), so every claim from them is exploratory.")
    if running:
        first = [f for f in running if not status_of(f)]
        later = [f for f in running if status_of(f)]
        if first:
            text += (f" Running, declared before its first trial (rows so far, judged once complete and published): "
                     f"{names(first)}.")
        if later:
            text += f" Running, redeclared (rows so far, judged once complete and published): {redeclared(later)}."
    unfinished = [c for c in (continuation.continuation(f, sources.results_dir) for f in published) if c is not None]
    return "\n\n".join([text, *map(continuation.continuation_text, unfinished)])


def rows_block(sources: Sources) -> str:
    """results/README.md: the rows of every study folder, as the Parquet records them (folder_rows)."""
    seeds = lambda s: f"{s[0]}–{s[-1]}" if len(s) > 1 else str(s[0]) if s else "—"  # noqa: E731
    table = [[code_span(r["folder"]), r["tasks"], r[OK], r[FAILED], r["aside"], seeds(r["seeds"]),
              r["span"], fmt(r["running_hours"], 3), fmt(r["thread_hours"], 3), r["resumed"],
              ", ".join(f"{c or '—'} ({n})" for c, n in r["commits"].items())]
             for r in folder_rows(sources.results_dir)]
    return markdown_table(["folder", "task", OK, FAILED, "set aside (not in space.json)", "seeds",
                           "first start → last finish (UTC)", "hours with a trial running", "thread-hours in trials",
                           "resumed after a stop", "commit (rows)"], table)


PROVENANCE_ROW = re.compile(r"^\| `(?P<folder>[^`|]+?)/?` \|(?P<rest>.*)$", re.M)
COUNT = re.compile(r"\b(\d[\d,]*) (ok|failed)\b")


def provenance_mismatches(results_dir: Path) -> list[str]:
    """Every "N ok" / "N failed" in the provenance table of results/README.md (a row per folder) that is not the
    count of that folder, or of one sweep folder under it, in the Parquet: typed counts checked, not trusted."""
    path = Path(results_dir) / "README.md"
    rows = folder_rows(Path(results_dir))
    messages = []
    for match in PROVENANCE_ROW.finditer(path.read_text(encoding="utf-8")):
        folder = match["folder"].rstrip("/")
        found = [r for r in rows if r["folder"] == folder or r["folder"].startswith(folder + "/")]
        for number, word in COUNT.findall(match["rest"]):
            allowed = sorted({r[OK if word == "ok" else FAILED] for r in found})
            if int(number.replace(",", "")) not in allowed:
                messages.append(f"{path}: the row of `{folder}/` says '{number} {word}', but its Parquet holds "
                                f"{' or '.join(map(str, allowed)) or 'no rows'} {word}; allowed: the counts in the "
                                f"generated 'study-rows' table")
    return messages


def pilots_block(sources: Sources) -> str:
    """The CIFAR-10 CPU-protocol pilots: one summary row (the CLI's JSON) per run, the one-seed gap they show,
    and the stopped 10-epoch start's rows."""
    runs = {}
    for path in sorted(sources.folder(PILOTS).glob("cifar10_cpu_*ep_seed0_*.json")):
        row = json.loads(read_text_file(path, PILOT_ALLOWED) or "null")
        if not isinstance(row, dict) or not isinstance(row.get("epochs"), int):
            raise AnswersError(f"{path} is not a summary row with an integer 'epochs'; allowed: the JSON the CLI "
                               f"prints")
        runs[(row["epochs"], md_text(f"{row.get('attention')}+{row.get('pe')}"))] = row  # read from a file

    def value(row: dict, name: str, scale: float = 100.0) -> float:
        x = row.get(name)
        return scale * x if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan

    rows = [[epochs, variant, fmt(value(r, "train_s_per_epoch", 1.0), 3), fmt(value(r, "test_acc")),
             f"{fmt(value(r, 'test_acc_draw_mean'))} [{fmt(value(r, 'test_acc_draw_min'))}]",
             fmt(value(r, "test_acc_draw_ensemble")), fmt(value(r, "test_acc_softmax_swap")),
             fmt(value(r, "attn_tv_to_softmax", 1.0), 3)]
            for (epochs, variant), r in sorted(runs.items(), key=lambda kv: (-kv[0][0], kv[0][1] != "softmax+ape"))]
    gaps = []
    for epochs in sorted({e for e, _ in runs}, reverse=True):
        soft, favor = runs.get((epochs, "softmax+ape")), runs.get((epochs, "favor+ape"))
        if soft and favor:
            gaps.append(f"{fmt(value(soft, 'test_acc') - value(favor, 'test_acc'), 3)} points on the training draw "
                        f"and {fmt(value(soft, 'test_acc') - value(favor, 'test_acc_draw_mean'), 3)} on the draw mean "
                        f"at {epochs} epochs")
    start = read_trials(sources.folder(PILOTS, "cifar10_cpu_10ep_start"), ["train"]).frame
    ordered = start.sort_values(["pe", "seed"])[["attention", "pe", "seed", "test_acc"]]
    started = "; ".join(f"{a}+{p} seed {s}: {fmt(100 * acc)}" for a, p, s, acc in ordered.itertuples(index=False))
    recorded = pd.DataFrame(list(runs.values()))
    names = pd.DataFrame({"device_name": [md_text(r["device_name"]) for r in runs.values()  # read from a file
                                          if isinstance(r.get("device_name"), str)]})
    timing = timing_text(recorded)
    lead = (f"Rows: {devices_text(names)}; times: " + ("possibly contended: the summary rows record no start/end "
            "times (the text above says which pilot shared the cores)." if timing == efficiency.UNKNOWN_TIMES
            else f"{timing}."))
    return "\n".join([lead, "", markdown_table(["epochs", "variant", "train s/epoch", "test acc % (training draw)",
                                      "draw mean % over fresh draws [min]", "draw ensemble %", "softmax swap %",
                                      "attention TV to softmax"], rows), "",
                      f"_Exploratory, one seed, no interval:_ softmax+ape − favor+ape is {'; '.join(gaps)}. The "
                      f"stopped 10-epoch start (`pilots/cifar10_cpu_10ep_start/`, not part of any result), test acc %: "
                      f"{started}."])


def step_times_block(sources: Sources) -> str:
    """The CIFAR-10 CPU protocol's training step per variant family, from its bench sweep (each trial alone):
    what the protocol's epoch count was planned from."""
    costs = sources.bench_costs
    g = costs[costs["sweep"] == "bench_cifar10_cpu"]
    if g.empty:
        raise AnswersError("results/bench_cifar10_cpu has no bench rows; allowed: the committed bench sweep")
    ms = lambda rows: (f"{fmt(rows['train_step_ms'].min(), 3)}" if len(rows) == 1 else  # noqa: E731
                       f"{fmt(rows['train_step_ms'].min(), 3)}–{fmt(rows['train_step_ms'].max(), 3)}")
    parts = [f"{ms(g[(g['attention'] == 'softmax') & (g['pe'] == 'ape') & (g['qk_norm'] == 'none')])} ms for "
             "softmax+ape",
             *(f"{ms(g[g['attention'] == a])} ms for {a}" for a in ("favor", "relu")),
             f"{ms(g[(g['attention'] == 'softmax') & (g['pe'] == 'rotinv')])} ms for softmax+rotinv"]
    return (f"The bench rows of its variants (`bench_cifar10_cpu/`, each alone; "
            f"{efficiency.time_devices(g)}) put a training step at "
            f"{', '.join(parts)}.")


def gpu_times_block(sources: Sources) -> str:
    """The packed 4-epoch GPU sweep: mean train s/epoch and images/s per variant (contended by design)."""
    frame = read_trials(sources.folder(GPU_FOLDER, GPU_SWEEP), ["train"]).frame
    frame = with_variant(frame)
    cells = frame.groupby(["attention", "pe"])[["train_s_per_epoch", "images_per_s"]].mean()
    pes = [p for p in ("ape", "luo_rpe", "circulant_string", "rope") if p in set(frame["pe"])]
    rows = [[attention, *(f"{fmt(cells.loc[(attention, pe), 'train_s_per_epoch'], 3)} s, "
                          f"{cells.loc[(attention, pe), 'images_per_s']:,.0f}/s" if (attention, pe) in cells.index
                          else "—" for pe in pes)] for attention in ("softmax", "favor", "relu")]
    lead = f"Rows: {devices_text(frame)}; times: {timing_text(frame)}."
    return "\n".join([lead, "", markdown_table(["attention", *pes], rows)])


def most_at_once(start: np.ndarray, end: np.ndarray) -> int:
    """The largest number of intervals [start, end) that hold one instant: at some interval's start, the
    intervals begun by then less those ended by then (efficiency.overlaps counts, per interval, every interval
    it meets at any time, which over-counts trials that ran one after another beside a long one)."""
    if len(start) == 0:
        return 0
    begun = np.searchsorted(np.sort(start), start, side="right")
    ended = np.searchsorted(np.sort(end), start, side="right")
    return int((begun - ended).max())


def sweep_run_text(folder: Path) -> str:
    """How a train sweep ran, from its rows alone: its ok rows against the trials its space.json lists, how many
    ran at once at most (their start and finish times), the training images (n_train x epochs_done per row)
    from the first start to the last finish and that rate, evaluation and start-up between trials included, its
    epochs and warm-up, and the model's parameter count. The figures the GPU sweep's paragraph quotes."""
    frame = read_trials(folder, ["train"]).frame
    listed = space_keys(folder)
    start = unix_seconds(frame["started_at"]).to_numpy()
    end = unix_seconds(frame["finished_at"]).to_numpy()
    wall = float(end.max() - start.min())
    images = float((frame["n_train"].astype(float) * frame["epochs_done"].astype(float)).sum())
    resumed = int((pd.to_numeric(column(frame, "resumed_from_epoch", 0), errors="coerce").fillna(0) > 0).sum())
    params = sorted(float(p) for p in frame["params"].unique())
    params_text = (f"{params[0] / 1e6:.2f} M" if params[0] == params[-1] else
                   f"{params[0] / 1e6:.2f}–{params[-1] / 1e6:.2f} M")
    warmup = sorted({float(w) for w in frame["warmup_epochs"]})
    epochs = sorted({int(e) for e in frame["epochs"]})
    warmup_text = "/".join(f"{fmt(w)} epoch ({fmt(100 * w / epochs[-1], 2)} %)" for w in warmup) if len(epochs) == 1 \
        else "/".join(fmt(w) for w in warmup) + " epoch"
    listed_text = f"of the {len(listed)} trials its space.json lists" if listed is not None else "(no space.json)"
    return (f"{len(frame)} ok rows {listed_text}, at most {most_at_once(start, end)} running at "
            f"once (their start and finish times), {resumed} resumed from a checkpoint. From the first trial's start "
            f"to the last one's finish, {images / 1e6:.3g} M training images (training-set size x epochs, summed over "
            f"the rows) went through in {wall:.0f} s: **{images / wall:,.0f} training images/s** for the whole sweep, "
            f"evaluation and the gaps between trials included. {'/'.join(map(str, epochs))} epochs, warm-up "
            f"{warmup_text}; {params_text} parameters; {devices_text(frame)}.")


def gpu_sweep_block(sources: Sources) -> str:
    """The packed 4-epoch GPU sweep as it ran (sweep_run_text of its rows)."""
    return sweep_run_text(sources.folder(GPU_FOLDER, GPU_SWEEP))


def epochs_of_space(folder: Path, root: Path) -> str:
    """'4 of the space's 200 epochs': the epochs a sweep's rows ran against those its space file (space.json's
    `source`, checked by continuation.space_name_and_source, read from the repository `root`) gives the trials of
    the rows' datasets; the rows' epochs alone where the space file is not there."""
    frame = read_trials(folder, ["train"]).frame
    ran = "/".join(str(e) for e in sorted({int(e) for e in frame["epochs"]}))
    try:
        _, source = continuation.space_name_and_source(folder)
        datasets = sorted(set(frame["dataset"].astype(str)))
        space = load_space(root / source, only={"dataset": datasets[0]} if len(datasets) == 1 else None)
    except (ConfigError, OSError) as err:
        return f"{ran} epochs (the space's own budget unknown: {md_text(' '.join(str(err).split())[:120])})"
    planned = "/".join(str(e) for e in sorted({int(t["epochs"]) for t in space.trials}))
    return f"{ran} of the space's {planned} epochs"


def gpu_answers_block(sources: Sources) -> str:
    """The short GPU rows' gap answers (exploratory; a few of the recipe's epochs: not an answer)."""
    gpu = Sources(sources.results_dir / GPU_FOLDER)
    budget = epochs_of_space(gpu.results_dir / GPU_SWEEP, sources.results_dir.resolve().parent)
    lines = [exploratory([GPU_SWEEP], gpu.results_dir) + f" _{budget}: early-training figures, not an answer._", "",
             f"softmax+ape scores {percent(accuracy_of(gpu, 'cifar10', 'softmax', 'ape'))} %."]
    for config in configurations(gpu.assessed[DRAW_MEAN], "cifar10"):
        lines += configuration_lines(gpu, config)
    return "\n".join(lines)


def gpu_bench_block(sources: Sources) -> str:
    """Each CIFAR-10 GPU-protocol variant alone on the H100: median training step (with the min and max of its
    repeats), ratios to softmax+ape and rope, inference, memory and FLOPs (efficiency.bench_cost_table)."""
    bench = read_trials(sources.folder(GPU_FOLDER, GPU_BENCH), ["bench"]).frame
    table = efficiency.bench_cost_table(bench)
    spread = with_variant(efficiency.cost_bench_rows(bench)).groupby(list(gap_closure.VARIANT)).agg(
        lo=("train_step_ms_min", "min"), hi=("train_step_ms_max", "max"))
    rows = [[f"{r['attention']}+{r['pe']}",
             f"{fmt(r['train_step_ms'], 3)} ({fmt(spread.loc[key, 'lo'], 3)}–{fmt(spread.loc[key, 'hi'], 3)})",
             fmt(r["train x softmax+ape"], 3), fmt(r["train x rope"], 3), fmt(r["infer_ms_per_sample"], 2),
             fmt(r["peak_mem_mb"], 4), fmt(r["flops"], 3)]
            for _, r in table.iterrows() for key in [tuple(r[c] for c in gap_closure.VARIANT)]]
    ratio = (spread["hi"] / spread["lo"]).sort_values()
    widest = ratio.index[-1]
    lead = (f"Each bench trial alone; {efficiency.time_devices(table)}. A variant's repeats span (max / min) "
            f"{fmt(ratio.iloc[0], 3)} to {fmt(ratio.iloc[-1], 3)} ({widest[VARIANT.index('attention')]}+{widest[VARIANT.index('pe')]}), median "
            f"{fmt(float(ratio.median()), 3)}: a ratio between two variants within that is not told apart.")
    return lead + "\n\n" + markdown_table(["variant", "train step ms, median (min–max of the repeats)",
                                          "x softmax+ape", "x rope",
                           "inference ms/image", "peak MiB", "multiply-adds/image (fvcore, forward)"], rows)


def gpu_packing_block(sources: Sources) -> str:
    """4-per-GPU against 1-per-GPU (benchmarks/gpu_packing.py JSON files)."""
    rows, devices = [], set()
    for path in sorted(sources.folder(GPU_FOLDER, GPU_PACKING).glob("*.json")):
        run = json.loads(read_text_file(path, PACKING_ALLOWED) or "null")
        devices.add(md_text(run.get("device")) if isinstance(run, dict) else "none")  # read from a file
        try:
            single, packed = run["single"], run["packed"]
            rows.append([md_text(path.stem), ", ".join(fmt(float(s), 4) for s in single["train_s_per_epoch"]),
                         f"{single['train_images_per_s']:,.0f}", fmt(float(max(single["peak_mem_mb"])), 4),
                         ", ".join(fmt(float(s), 4) for s in packed["train_s_per_epoch"]),
                         f"{packed['train_images_per_s']:,.0f}", fmt(float(run["ratio_train_phase"]), 3),
                         fmt(float(run["ratio_end_to_end"]), 3)])
        except (KeyError, TypeError, ValueError) as err:
            raise AnswersError(f"{path} is not a benchmarks/gpu_packing.py result ({type(err).__name__}: {err}); "
                               f"allowed: the JSON it writes") from err
    lead = (f"Device as these files record it: {', '.join(sorted(devices)) or 'none'} (the GPU model is not "
            "recorded in them); 1-per-GPU: one trial on the GPU, 4-per-GPU: four at once (contended by design); what "
            "else ran on the machine is not recorded in them.")
    return lead + "\n\n" + markdown_table(["run", "1-per-GPU s/epoch", "1-per-GPU images/s", "peak MiB",
                           "4-per-GPU s/epoch, each trial", "4-per-GPU aggregate images/s", "ratio, train phase",
                           "ratio, end to end"], rows)


def mnist_redraw_table(sources: Sources) -> str:
    """docs/random_features.md: per random-feature variant of the converged MNIST study (qk_norm none), its
    training-draw and draw-mean accuracy, softmax swap and attention TV, redraw off against redrawn."""
    s = sources.seeds
    rows = []
    for (attention, pe, redraw), g in s[(s["dataset"] == "mnist") & s["attention"].isin(["favor", "relu"])
                                        & (s["qk_norm"] == "none")
                                        & s["pe"].isin(["ape", "luo_rpe", "rope", "circulant_string"])].groupby(
            ["attention", "pe", "redraw"]):
        rows.append([f"{attention}+{pe}", redraw, percent(g[TRAIN_DRAW]), percent(g[DRAW_MEAN]),
                     percent(g["test_acc_softmax_swap"]), mean_interval(g[gap_closure.FIDELITY]).text(digits=3)])
    rows.sort(key=lambda r: (r[1] != "off", r[0]))
    return markdown_table(["variant", "redraw", "training draw %", "draw mean %", "softmax swap %",
                           "TV to softmax"], rows)


def recipe_table(sources: Sources) -> str:
    """docs/usage.md: each dataset's recipe, what a config that leaves a field alone runs (rpevit.data,
    rpevit.pe.relative_bias), and per knob chosen on validation the published study that chose it."""
    from rpevit.data import DATASET_SPECS

    chosen_by = {}
    for folder in current_validation_folders(sources.results_dir):
        found = validation_choice.chosen_for_every_variant(folder)
        if found is not None:
            chosen_by[found[:2]] = folder.name
    rows = []
    for name, spec in DATASET_SPECS.items():
        cfg = TrialConfig.from_dict({"dataset": name, "pe": "luo_rpe"}).resolved()
        studies = [chosen_by.get((name, knob)) for knob in validation_choice.JOINT]
        rows.append([name, f"{spec.image_size} / {cfg.resolved_patch_size} ({cfg.grid[0] * cfg.grid[1]})",
                     str(cfg.batch_size), fmt(cfg.lr), fmt(cfg.warmup_epochs), cfg.init, fmt(cfg.grad_clip),
                     f"every {cfg.redraw_interval} until {fmt(cfg.redraw_until)}", fmt(cfg.luo_scale),
                     ", ".join(code_span(s) for s in studies if s) or "none"] +
                    [", ".join("/".join(knob) for knob, s in zip(validation_choice.JOINT, studies) if not s) or "—"])
    return markdown_table(["dataset", "image / patch (tokens)", "batch", "lr", "warm-up epochs", "init", "grad_clip",
                           "redraw", "luo_scale", "chosen on validation by", "not chosen on this dataset's validation"],
                          rows)
