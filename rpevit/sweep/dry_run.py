"""What `sweep.py --dry-run` says beyond the trial table: what will run, on what, and how long.

- the effective values: every field one value in all trials (after `--set`, which is marked), as
  the trials will run them (resolved: the dataset recipe's batch size, lr, ...);
- the data each dataset reads (`<data dir>/<dataset>.npz`), checked as a trial will check it: found,
  missing (a trial would download it where it is online), or what a trial would refuse (a folder
  where the .npz should be, a missing file with RPEVIT_OFFLINE=1): a warning here, and a real local
  sweep stops on it before Ray starts (`check_data`);
- a warning when the space is made for GPUs (gpus_per_trial > 0, CUDA graphs, bf16, device cuda) and
  torch sees none on this machine, with the flags that run it on the CPU (`compile: on` alone is no
  GPU request: on the CPU it pays for some variants, results/compile_cpu_1thread/);
- what the run would refuse before any trial starts: a trial that asks for more CPUs than this machine
  has (`cpus_per_trial`: the run stops on it before Ray starts, `cpu_refusal`), with the flag that fits;
- an estimate of the run's wall time from measured rows of this sweep's folder (the rows
  `--deadline` plans from, rpevit.sweep.deadline), labelled with where it came from; without such rows,
  an order of magnitude from the committed bench studies of this device class (`bench_estimate`:
  results/bench_*/, training steps only, scaled by tokens, width and depth), labelled as such.

The same data check runs before a real local sweep (`check_data`): a file that cannot be had stops it
before anything starts.
"""
from __future__ import annotations

import math
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from rpevit.config import ConfigError, TrialConfig
from rpevit.data import (DIGITS_TEST_FRACTION, FOLDERLESS_DATASETS, DataError, check_train_subset, dataset_file,
                         training_images)
from rpevit.sweep import deadline as deadlines
from rpevit.sweep.lock import sweep_dir
from rpevit.sweep.launch_plan import Launch, deadline_units, plan_launch, rungs_first_units
from rpevit.sweep.plan import SweepPlan, prepare_trials
from rpevit.sweep.protocol import FAILED, OK
from rpevit.sweep.results import TRIALS_FILE, DamagedResults, task_metrics
from rpevit.sweep.store import holds_rows, read_rows
from rpevit.sweep.space import Resources, Space

GPU_FIELDS = {"compile": ("cudagraphs",), "amp": ("bf16",), "device": ("cuda",)}  # values that ask for a GPU
CPU_FIXES = {**GPU_FIELDS, "compile": ("on", "cudagraphs")}  # what a GPU space's CPU run turns off


ALWAYS_SHOWN = ("task", "dataset", "attention", "pe", "epochs", "batch_size", "lr")  # what a reader looks for first


def effective_values(space: Space, overrides: dict[str, Any]) -> str:
    """'every trial: dataset=digits epochs=1 (--set) ...': the fields with one value in all trials that
    are ALWAYS_SHOWN, differ from TrialConfig's defaults or were set on the command line, as the trials
    run them (resolved)."""
    defaults = {f.name: f.default for f in fields(TrialConfig)}
    varying = set(space.varying_fields())
    shown = [f"{name}={space.trials[0][name]}" + (" (--set)" if name in overrides else "")
             for name in defaults if name not in varying and name != "data_dir"
             and (name in ALWAYS_SHOWN or name in overrides or space.trials[0][name] != defaults[name])]
    return "every trial: " + (" ".join(shown) or "the defaults (python sweep.py --fields)")


# the tasks whose trials read their dataset's file; `bench` times random images of the dataset's shape and
# `kernel_mse` draws its own vectors, so their spaces need no data (a bench sweep on a GPU without CIFAR-10 once
# tried to download it before any trial started)
DATA_TASKS = ("train",)


def datasets_read(space: Space, data_dir: str | None) -> list[tuple[str, str]]:
    """(dataset, folder given) of every trial that reads its dataset's file (DATA_TASKS)."""
    return sorted({(t["dataset"], data_dir or t["data_dir"] or "") for t in space.trials
                   if t.get("task", "train") in DATA_TASKS})


def data_lines(space: Space, data_dir: str | None, *, refuse: bool = False) -> list[str]:
    """Per dataset that reads a folder, where its file is looked for and whether it is there, checked as
    a trial checks it (rpevit.data.dataset_file: the folder is a folder, the .npz a file, a missing one
    downloadable). What a trial would refuse is an error with `refuse` (a real run), a warning otherwise."""
    lines = []
    free = sorted({t.get("task", "train") for t in space.trials} - set(DATA_TASKS))
    if free:
        lines.append(f"data: none read by task {', '.join(free)} (data-free: random inputs of the dataset's shape)")
    for dataset, chosen in datasets_read(space, data_dir):
        if dataset in FOLDERLESS_DATASETS:
            lines.append(f"data: {dataset} is bundled with scikit-learn (no data folder)")
            lines += subset_lines(space, dataset, chosen, data_dir, refuse=refuse)
            continue
        try:
            path = dataset_file(dataset, chosen or None)
        except DataError as err:
            message = f"{_source(data_dir, chosen)}: {err}"
            if refuse:
                raise ConfigError(message) from err
            lines.append(f"warning: data: {message}; the sweep would stop here")
            continue
        if path.is_file():
            lines.append(f"data: {path} found")
            lines += subset_lines(space, dataset, chosen, data_dir, refuse=refuse)
        else:
            folder = path.parent
            missing = "" if folder.is_dir() else f" (the folder {folder} does not exist either)"
            lines.append(f"warning: data: {path} is missing{missing}: each trial would download {dataset} there "
                         f"from the internet, or fail where it is offline; give --data-dir DIR (a folder holding "
                         f"{dataset}.npz) if it is elsewhere")
    return lines


def subset_lines(space: Space, dataset: str, chosen: str, data_dir: str | None, *, refuse: bool) -> list[str]:
    """The trials of `dataset` read from `chosen` whose train_subset exceeds their training split (the number
    of training images read from the file's header, rpevit.data.training_images): each would fail as it loads
    its data, so the dry run warns and a real local sweep refuses before Ray starts (one line, the first such)."""
    asked = sorted({(t.get("train_subset", 0), t.get("val_fraction", TrialConfig.val_fraction))
                    for t in space.trials if t.get("task", "train") in DATA_TASKS and t["dataset"] == dataset
                    and (data_dir or t["data_dir"] or "") == chosen and t.get("train_subset", 0)})
    n_images = training_images(dataset, chosen or None) if asked else None
    for train_subset, val_fraction in asked if n_images is not None else ():
        try:
            check_train_subset(dataset, n_images, val_fraction, train_subset)
        except DataError as err:
            if refuse:
                raise ConfigError(str(err)) from err
            return [f"warning: data: {err}; each such trial would fail as it loads its data"]
    return []


def _source(data_dir: str | None, chosen: str) -> str:
    if data_dir:
        return f"--data-dir {data_dir!r}"
    return "field 'data_dir'" if chosen else ("$RPEVIT_DATA" if os.environ.get("RPEVIT_DATA") else "./data")


def check_data(space: Space, data_dir: str | None) -> None:
    """Before a local sweep starts: refuse a dataset file that cannot be had (data_lines' errors)."""
    data_lines(space, data_dir, refuse=True)


def fetch_missing(space: Space, data_dir: str | None, say=print) -> None:
    """Before a local sweep starts (after check_data): each dataset file that is missing is fetched once,
    here, by the download a trial would make (rpevit.data.load_arrays), so that a folder that plainly
    lacks the file is one line before Ray starts whether or not RPEVIT_OFFLINE says downloads are off
    (it used to be ~150 lines of Ray traceback per try, and every trial downloading the same file at
    once where the machine is online). ConfigError, one line, when the download fails."""
    from rpevit.data import load_arrays

    for dataset, chosen in datasets_read(space, data_dir):
        if dataset in FOLDERLESS_DATASETS:
            continue
        path = dataset_file(dataset, chosen or None)
        if path.is_file():
            continue
        say(f"data: {path} is missing: downloading {dataset} there once, before any trial starts", flush=True)
        try:
            load_arrays(dataset, chosen or None)
        except DataError as err:
            raise ConfigError(f"{_source(data_dir, chosen)}: {err}") from err


def local_cpus() -> int:
    """The CPUs this process may use: what the planner counts for this machine (local_node)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_refusal(resources: Resources, local: bool) -> str | None:
    """The one line a local run refuses a trial bigger than this machine with (a trial that asks for more
    CPUs than there are would wait forever on the embedded Ray), or None; the same rule as the run's
    check after Ray started (session.check_fits), so that a dry run says it and a run stops before Ray."""
    cpus = local_cpus()
    if not local or resources.cpus_per_trial <= cpus:
        return None
    return (f"cpus_per_trial has value {resources.cpus_per_trial:g} but this machine has {cpus:g}; allowed: "
            f"<= {cpus:g} (--cpus-per-trial {cpus:g}, or join a bigger cluster with --address)")


def gpu_warning(space: Space, resources: Resources, local: bool) -> str | None:
    """A space made for GPUs dry-run where torch sees no GPU, and how to run it on the CPU instead."""
    gpu = resources.gpus_per_trial > 0 or any(t[name] in values for name, values in GPU_FIELDS.items()
                                              for t in space.trials)
    if not gpu or not local:
        return None
    asks = [f"gpus_per_trial {resources.gpus_per_trial:g}"] if resources.gpus_per_trial > 0 else []
    for name, values in CPU_FIXES.items():
        found = sorted({t[name] for t in space.trials if t[name] in values})
        asks += [f"{name} {'/'.join(found)}"] if found else []
    import torch

    if torch.cuda.is_available():
        return None
    fixes = (["--gpus-per-trial 0"] if resources.gpus_per_trial > 0 else []) + [
        f"--set {name}={'off' if name == 'compile' else 'none' if name == 'amp' else 'cpu'}"
        for name, values in CPU_FIXES.items() if any(t[name] in values for t in space.trials)]
    if resources.cpus_per_trial > local_cpus():  # the whole advice: with these flags the run starts here
        fixes.append(f"--cpus-per-trial {local_cpus():g}")
    return (f"warning: this space is made for GPUs ({', '.join(asks)}) and torch sees no GPU on this machine: "
            f"trials that need a GPU never start here, and bf16 is slow on a CPU (compile pays there for some "
            f"variants only: results/compile_cpu_1thread/). On the CPU: "
            f"{' '.join(fixes)}")


def estimate_line(space: Space, resources: Resources, results_dir: str, data_dir: str | None, resume: bool,
                  local: bool, rungs_first: bool = False) -> str:
    """The run's wall time from measured rows of this sweep's folder (those --deadline plans from), or
    why there is none; with --rungs-first, also when its first round (every shorter trial) ends. Reads the
    folder only (a dry run takes no lock and changes nothing)."""
    out_dir = sweep_dir(results_dir, space.name)
    try:
        rows = read_rows(out_dir / TRIALS_FILE) if holds_rows(out_dir) else []  # the compacted file and parts
    except DamagedResults as err:
        return f"estimate: none ({err})"
    done = {r.get("trial_key") for r in rows if r.get("status") in (OK, FAILED)} & set(space.current_keys)
    if done and not resume:
        return (f"warning: {out_dir} already holds results of sweep {space.name!r}: the run needs --resume (it "
                f"continues), or another --name / --results-dir")
    pending = [i for i, key in enumerate(space.keys) if key not in done]
    if not pending:
        return "estimate: nothing to run (every trial of the space has a row)"
    launch = plan_launch(space, SweepPlan(prepare_trials(space, data_dir), pending, resources), out_dir / "trials",
                         [local_node(resources)] if local else None)  # the Tune trials a run would start
    units = deadline_units(launch.specs)
    estimator = deadlines.Estimator(rows, space.task, has_epochs=bool(task_metrics(space.task).epoch))
    if not estimator.measured:
        none = f"no finished trial of task {space.task!r} in {out_dir / TRIALS_FILE} to measure from"
        rough = bench_estimate(space, launch.trial_indices(space), resources, launch.slots, local)
        if rough is not None:
            return f"estimate: none measured ({none}); {rough}; `--deadline` would run one trial first and plan " \
                   f"the rest from it"
        return (f"estimate: none available ({none}); `--deadline` would run one trial first and plan the rest "
                f"from it")
    slots = launch.slots
    plan = deadlines.plan_units(units, estimator, slots=slots, now=0.0, deadline=deadlines.Deadline(math.inf),
                                checkpoint_root=out_dir / "trials", probe=False)
    unknown = sum(e is None for e in plan.estimates)
    where = "on this machine" if local else "(--address: the cluster's slots are not known here)"
    total = f"about {deadlines.span(plan.finish_at)}" if unknown < len(units) else "no matching row"
    return (f"estimate (from measured rows of {out_dir / TRIALS_FILE}): {total} for {len(units) - unknown} of "
            f"{len(units)} Tune trial(s), {slots} at a time {where}; {plan.estimate_text()}"
            + (f"; {unknown} without a matching row not counted" if unknown else "")
            + (rounds_text(space, launch, estimator, slots, out_dir) if rungs_first else ""))


def rounds_text(space: Space, launch: Launch, estimator: deadlines.Estimator, slots: int, out_dir: Path) -> str:
    """'; --rungs-first: round 1 (...) about A, round 2 (...) about B more': each round planned as it runs (a
    Tuner.fit of its own, its own start-up), its trunks paused at or continued from their last branch."""
    if not any(spec.branches for spec in launch.specs):
        return ""
    one, two = rungs_first_units(space, launch)
    plans = [deadlines.plan_units(units, estimator, slots=slots, now=0.0, deadline=deadlines.Deadline(math.inf),
                                  checkpoint_root=out_dir / "trials", probe=False) for units in (one, two)]
    if any(e is None for p in plans for e in p.estimates):
        return "; --rungs-first: its rounds not estimated (a Tune trial without a matching row)"
    spans = [deadlines.span(p.finish_at) if p.admitted else "nothing" for p in plans]
    return (f"; --rungs-first: round 1 ({len(one)} Tune trial(s): every shorter trial, the trunks to their last "
            f"branch) about {spans[0]}, then round 2 ({len(two)} trunk(s) to their own budget) about {spans[1]}")


BENCH_ROOT = Path(__file__).resolve().parents[2] / "results"  # the committed studies (results/STUDIES)
TRAIN_IMAGES = {"digits": round(1797 * (1 - DIGITS_TEST_FRACTION)), "mnist": 60_000, "cifar10": 50_000,
                "cifar100": 50_000}  # each dataset's training split, before the validation hold-out


def forward_cost(cfg: dict[str, Any]) -> float:
    """A ViT's multiply-adds per image, up to a constant: depth x tokens x dim x (the linear layers'
    (4 + 2 mlp_ratio) dim + the attention's 2 tokens). Only its ratio between two models is used."""
    tokens = (int(cfg["image_size"]) // int(cfg["patch_size"])) ** 2
    dim = float(cfg["dim"])
    return float(cfg["depth"]) * tokens * dim * ((4 + 2 * float(cfg["mlp_ratio"])) * dim + 2 * tokens)


def committed_bench_rows(device_class: str, root: Path = BENCH_ROOT) -> list[dict[str, Any]]:
    """The ok rows of the committed bench studies (results/**/bench*/trials.parquet) measured on this
    device class ("cpu": no CUDA device; "gpu": one), each with its folder; [] where none is readable."""
    rows = []
    for path in sorted(root.glob("**/bench*/trials.parquet")):
        try:
            found = read_rows(path)
        except (DamagedResults, OSError):
            continue
        for row in found:
            on_gpu = isinstance(row.get("cuda_device"), (int, float)) and row["cuda_device"] >= 0
            step = row.get("train_step_ms")
            if row.get("status") == OK and row.get("task") == "bench" and on_gpu == (device_class == "gpu") \
                    and isinstance(step, (int, float)) and math.isfinite(step) and step > 0:
                rows.append({**row, "folder": str(path.parent.relative_to(root.parent))})
    return rows


def bench_seconds(trial: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[float, set[str]] | None:
    """(seconds of a train trial's training steps, the bench folders they come from), from committed bench
    rows (committed_bench_rows) of its attention and encoding (the same dataset where there are some): their
    training step per image scaled by forward_cost to the trial's model and batch, at least their cheapest
    step per block times its depth (a small model's step is its fixed cost per block: launches, AdamW,
    Python, not its FLOPs), times its steps and epochs. None without such rows. Against the 731 committed
    CPU train rows' measured train_s_per_epoch: median 1.1x, 90% of them within 0.57x to 2.8x of it
    (tests/test_newcomer_small_things.py checks a sample)."""
    same = [r for r in rows if r.get("attention") == trial["attention"] and r.get("pe") == trial["pe"]]
    same = [r for r in same if r.get("dataset") == trial["dataset"]] or same
    if not same:
        return None
    per_image_s = sorted(r["train_step_ms"] / 1000 / max(1, int(r.get("bench_batch") or 1))
                         * forward_cost(trial) / forward_cost(r) for r in same)[len(same) // 2]
    floor_s = min(r["train_step_ms"] / 1000 / max(1, int(r.get("depth") or 1)) for r in same) * int(trial["depth"])
    images = round(TRAIN_IMAGES.get(trial["dataset"], 50_000) * (1 - float(trial["val_fraction"])))
    images = min(images, int(trial["train_subset"])) if trial["train_subset"] else images
    batch = max(1, min(int(trial["batch_size"]), images))
    seconds = max(per_image_s * batch, floor_s) * math.ceil(images / batch) * int(trial["epochs"])
    return seconds, {r["folder"] for r in same}


def bench_estimate(space: Space, indices: list[int], resources: Resources, slots: int, local: bool,
                   root: Path = BENCH_ROOT) -> str | None:
    """An order of magnitude of a train space's wall time without rows of its own: each trial's training
    steps from the committed bench rows of this device class (bench_seconds), summed and shared over the
    slots that run at once; the line says what it leaves out (evaluation, start-up, contention) and where
    it comes from. None for other tasks or without such rows."""
    if space.task != "train" or not indices:
        return None
    gpu = resources.gpus_per_trial > 0
    if gpu and local:
        import torch

        gpu = torch.cuda.is_available()
    rows = committed_bench_rows("gpu" if gpu else "cpu", root)
    if not rows:
        return None
    total, used, unmatched = 0.0, set(), 0
    for i in indices:
        found = bench_seconds(space.trials[i], rows)
        if found is None:
            unmatched += 1
            continue
        total, used = total + found[0], used | found[1]
    if not used:
        return None
    devices = sorted({str(r.get("device_name")) for r in rows if r["folder"] in used})
    where = "on this machine" if local else "(--address: the cluster's slots are not known here)"
    counted = len(indices) - unmatched
    wall = deadlines.STARTUP_S + (total + deadlines.PER_TRIAL_S * counted) / max(1, slots)  # as --deadline plans
    return (f"order of magnitude only, from the committed bench rows of {', '.join(sorted(used))} "
            f"({'; '.join(devices)}: training steps, scaled by tokens, width, depth and batch, with --deadline's "
            f"{deadlines.STARTUP_S:g} s of start-up and {deadlines.PER_TRIAL_S:g} s per trial; evaluation and other "
            f"load on the machine not counted): about {deadlines.span(wall)} for {counted} of {len(indices)} "
            f"trial(s), {slots} at a time {where}"
            + (f"; {unmatched} without a bench row of their attention and encoding not counted" if unmatched else ""))


def local_node(resources: Resources) -> dict[str, float]:
    """This machine as the planner sees a node: the CPUs this process may use, and its GPUs when a
    trial asks for some (torch is asked only then)."""
    cpus = local_cpus()
    if resources.gpus_per_trial <= 0:
        return {"CPU": float(cpus)}
    import torch

    return {"CPU": float(cpus), "GPU": float(torch.cuda.device_count())}


def describe(space: Space, overrides: dict[str, Any], resources: Resources, *, results_dir: str,
             data_dir: str | None, resume: bool, local: bool, rungs_first: bool = False) -> list[str]:
    """The dry run's lines after the trial table (module docstring)."""
    lines = [effective_values(space, overrides),
             f"resources: {resources.cpus_per_trial:g} CPU + {resources.gpus_per_trial:g} GPU per trial"
             + (f", at most {resources.max_concurrent} at once" if resources.max_concurrent else "")]
    lines += data_lines(space, data_dir) if local else [
        "data: read on the cluster's nodes (--address / $RAY_ADDRESS): not checked here"]
    refusal = cpu_refusal(resources, local)
    lines += [f"warning: the run would refuse this before any trial starts: {refusal}"] if refusal else []
    warning = gpu_warning(space, resources, local)
    lines += [warning] if warning else []
    lines.append(estimate_line(space, resources, results_dir, data_dir, resume, local, rungs_first))
    return lines
