"""Aggregate training throughput of K trials packed on one GPU vs one trial alone on it.

    .venv/bin/python benchmarks/gpu_packing.py --data-dir ../shared/data --pack 4
    .venv/bin/python benchmarks/gpu_packing.py --data-dir ../shared/data --dataset cifar10 --pack 4 \
        -- --dim 192 --depth 9 --heads 12 --drop-path 0.1 --label-smoothing 0.1 --augment crop_flip \
        --weight-decay 0.05 --warmup-epochs 0.1   # all12.yaml's CIFAR-10 model and recipe, 1 epoch
    .venv/bin/python benchmarks/gpu_packing.py --data-dir ../shared/data --device cpu --train-subset 1000 \
        --threads 1 -- --dim 16 --depth 1          # a CPU dry run of the same code path
    .venv/bin/python benchmarks/gpu_packing.py --show-row single.json   # s/epoch, images/s of one row

Why: a tiny ViT leaves most of a GPU idle (launch-bound steps), so a sweep packs trials at
`gpus_per_trial: 0.25`. Whether that pays is this ratio. Each trial is one
`python -m rpevit.cli --dataset {mnist,cifar10} --epochs 1 --amp bf16` process (seed i for trial i); the
packed ones are started together and, on CUDA, capped at 1/K of the GPU memory each, as a sweep's
fractional trials are (rpevit.sweep.trainable.place_on_devices). Two aggregates are printed:

- train phase: the sum over the concurrent trials of images_per_s (= n_train / train_s_per_epoch,
  CUDA-synchronised epoch time from each JSON row): the GPU's training throughput while packed;
- end to end: sum of n_train * epochs over the trials / wall seconds from the first start to the
  last finish, start-up, data loading and evaluation included: what a sweep's wall clock sees.

The 1-per-GPU figures come from one trial alone, run first, with the same flags and threads.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
# the child: optionally cap this process's share of GPU memory, then the ordinary train CLI
CHILD = ("import sys, torch\n"
         "fraction = float(sys.argv[1])\n"
         "if fraction < 1:\n"
         "    torch.cuda.set_per_process_memory_fraction(fraction)\n"
         "from rpevit.cli import main\n"
         "sys.exit(main(sys.argv[2:]))\n")


@dataclass
class Trial:
    seed: int
    row: dict
    start: float
    end: float

    @property
    def images(self) -> float:
        return float(self.row["n_train"]) * float(self.row["epochs_done"])


def last_json_row(text: str) -> dict:
    """The summary row: the last stdout line that is a JSON object (`--quiet` prints only it,
    but a library may still print a stray line before it)."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"no JSON row in the output: {text[-500:]!r}")


def train_args(args: argparse.Namespace, seed: int) -> list[str]:
    flags = ["--quiet", "--dataset", args.dataset, "--data-dir", str(args.data_dir), "--epochs", str(args.epochs),
             "--device", args.device, "--amp", args.amp, "--seed", str(seed)]
    if args.train_subset:
        flags += ["--train-subset", str(args.train_subset)]
    return flags + args.extra


def open_log(path: Path) -> IO[str]:
    """A child's log (its stdout or stderr), truncated and opened never through a link (O_NOFOLLOW): the logs
    lie beside --out, where a link planted at a log's name would have the child overwrite what it points at.
    A link, or a folder that cannot take the file, stops the run with one line naming the path."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:
        why = "it is a symbolic link" if err.errno == errno.ELOOP else (err.strerror or str(err))
        raise SystemExit(f"error: cannot write {path} ({why}); allowed: a regular file or nothing there, in a "
                         f"folder this user can write (never written through a link)") from None
    return os.fdopen(fd, "w")


def write_out(path: Path, result: dict) -> None:
    """--out as JSON through rpevit's no-follow atomic writer (rpevit.analysis.common.write_text_file: a link
    there stops with one line, its target untouched). Imported here: the parent needs rpevit only for this."""
    sys.path.insert(0, str(ROOT))
    from rpevit.analysis.common import write_text_file

    write_text_file(path, json.dumps(result, indent=1))


def run_concurrently(args: argparse.Namespace, count: int, log_dir: Path) -> list[Trial]:
    """Start `count` trainings at once; wait for all; their rows and wall-clock spans."""
    fraction = 1.0 / count if args.device == "cuda" and count > 1 else 1.0
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    running = []
    for seed in range(count):
        out, err = (open_log(log_dir / f"pack{count}_seed{seed}.{kind}") for kind in ("json", "log"))
        cmd = [sys.executable, "-c", CHILD, str(fraction), *train_args(args, seed)]
        running.append((seed, time.time(), subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=err),
                        out, err))
    ends: dict[int, float] = {}
    while len(ends) < len(running):  # poll, so that each trial's end time is its own
        for seed, _, proc, _, _ in running:
            if seed not in ends and proc.poll() is not None:
                ends[seed] = time.time()
        time.sleep(0.05)
    trials, failed = [], []
    for seed, start, proc, out, err in running:
        out.close()
        err.close()
        if proc.returncode != 0:
            failed.append(f"seed {seed} exited {proc.returncode}; stderr tail:\n{Path(err.name).read_text()[-2000:]}")
            continue
        trials.append(Trial(seed, last_json_row(Path(out.name).read_text()), start, ends[seed]))
    if failed:
        raise SystemExit("\n".join(failed))
    return trials


def aggregate(trials: list[Trial]) -> dict:
    wall = max(t.end for t in trials) - min(t.start for t in trials)
    return {"trials": len(trials),
            "train_images_per_s": sum(float(t.row["images_per_s"]) for t in trials),
            "end_to_end_images_per_s": sum(t.images for t in trials) / wall,
            "wall_s": wall,
            "train_s_per_epoch": [float(t.row["train_s_per_epoch"]) for t in trials],
            "peak_mem_mb": [float(t.row["peak_mem_mb"]) for t in trials],
            "device_name": trials[0].row["device_name"]}


def show_row(path: Path) -> None:
    row = last_json_row(path.read_text())
    print(f"{row.get('dataset', '?')} 1 trial: {row['train_s_per_epoch']:.2f} s/epoch, "
          f"{row['images_per_s']:.0f} images/s "
          f"(n_train {row['n_train']}, {row['epochs_done']} epoch(s), test_acc {row['test_acc']:.4f}, "
          f"peak {row['peak_mem_mb']:.0f} MiB {row['peak_mem_kind']}, {row['device_name']})")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:  # everything after `--` goes to every `python -m rpevit.cli`
        split = argv.index("--")
        argv, extra = argv[:split], argv[split + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show-row", type=Path, help="only print s/epoch and images/s of this JSON output")
    parser.add_argument("--data-dir", type=Path, default=os.environ.get("RPEVIT_DATA"),
                        help="folder holding <dataset>.npz (default: $RPEVIT_DATA)")
    parser.add_argument("--dataset", choices=("mnist", "cifar10"), default="mnist",
                        help="every trial's dataset (default mnist); model flags go after `--`")
    parser.add_argument("--pack", type=int, default=4, help="trials sharing the GPU (default 4)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--amp", choices=("bf16", "none", "auto"), default="bf16")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--train-subset", type=int, default=0, help="0: all of MNIST's training split")
    parser.add_argument("--threads", type=int, default=0,
                        help="CPU threads per trial (default: cores // pack, at least 1)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON; logs beside it")
    args = parser.parse_args(argv)
    args.extra = extra
    if args.show_row:
        show_row(args.show_row)
        return 0
    if args.data_dir is None or not (Path(args.data_dir) / f"{args.dataset}.npz").is_file():
        parser.error(f"--data-dir {args.data_dir} holds no {args.dataset}.npz (pass --data-dir or set $RPEVIT_DATA)")
    if args.pack < 2:
        parser.error(f"--pack {args.pack}; allowed: >= 2 (compared with 1 trial alone)")
    args.data_dir = Path(args.data_dir).resolve()
    args.threads = args.threads or max(1, (os.cpu_count() or 1) // args.pack)
    if args.out:
        log_dir = args.out.parent / "gpu_packing_logs"
        for path in (args.out, log_dir):  # refused before the run, not after it (write_out would refuse too)
            if path.is_symlink():
                parser.error(f"{path} is a symbolic link; allowed: a regular file or folder, or nothing there "
                             f"(never written through a link)")
        log_dir.mkdir(parents=True, exist_ok=True)
    else:
        log_dir = Path(tempfile.mkdtemp(prefix="gpu_packing_"))

    print(f"1 trial alone, then {args.pack} at once, on {args.device} ({args.threads} CPU thread(s) each); "
          f"logs in {log_dir}", flush=True)
    single = aggregate(run_concurrently(args, 1, log_dir))
    packed = aggregate(run_concurrently(args, args.pack, log_dir))
    ratio_train = packed["train_images_per_s"] / single["train_images_per_s"]
    ratio_wall = packed["end_to_end_images_per_s"] / single["end_to_end_images_per_s"]
    print(f"{'':>12} {'train-phase images/s':>22} {'end-to-end images/s':>21} {'wall s':>8}  s/epoch per trial")
    for label, agg in (("1-per-GPU", single), (f"{args.pack}-per-GPU", packed)):
        per = ", ".join(f"{s:.2f}" for s in agg["train_s_per_epoch"])
        print(f"{label:>12} {agg['train_images_per_s']:>22.0f} {agg['end_to_end_images_per_s']:>21.0f} "
              f"{agg['wall_s']:>8.1f}  {per}")
    print(f"{'ratio':>12} {ratio_train:>22.2f} {ratio_wall:>21.2f}   ({args.pack}-per-GPU / 1-per-GPU, "
          f"{single['device_name']})")
    if args.out:
        result = {"device": args.device, "dataset": args.dataset, "pack": args.pack, "threads": args.threads,
                  "epochs": args.epochs,
                  "train_subset": args.train_subset, "extra_flags": extra, "single": single, "packed": packed,
                  "ratio_train_phase": ratio_train, "ratio_end_to_end": ratio_wall}
        write_out(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
