"""Run a sweep on Ray Tune: `python sweep.py --space search_spaces/smoke.yaml`.

The space is expanded and validated before anything runs (`--dry-run` shows the trial table).
Results land in <results-dir>/<name>/{trials,epochs}.parquet; `--resume` continues a killed
sweep. `--deadline` starts only the trials predicted to end before it (rpevit/sweep/deadline.py) and
prints the command that continues. Exit code: 0 all trials ok (or left for a later --resume by
--deadline), 1 some failed, 2 bad space or options (or the sweep folder is in use by another driver),
130 interrupted by Ctrl-C (the running trials stopped, the rows so far kept; --resume continues), 143 stopped
by SIGTERM (at any moment: one line, Ray shut down, the lock released; rpevit/sigterm.py).
"""
from __future__ import annotations

if __name__ == "__main__":  # first: the imports below take seconds, and SIGTERM must end even them in 143
    from rpevit import sigterm

    sigterm.install()

import argparse  # noqa: E402 (every import below: after the SIGTERM handler)
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from rpevit import sigterm  # noqa: E402
from rpevit.config import ConfigError  # noqa: E402
from rpevit.sweep import dry_run  # noqa: E402
from rpevit.sweep.deadline import check_estimate, parse_deadline  # noqa: E402
from rpevit.sweep.launch_plan import check_rungs_first  # noqa: E402
from rpevit.sweep.lock import sweep_dir  # noqa: E402
from rpevit.sweep.session import check_address  # noqa: E402
from rpevit.sweep.space import DEFAULT_MAX_TRIALS, Space, check_name, load_space, parse_overrides  # noqa: E402

INTERRUPTED_EXIT = 130  # 128 + SIGINT (rpevit.sweep.summary.INTERRUPTED_EXIT; not imported: it loads pandas)
DEFAULT_MAX_FAILURES = 1  # retries per trial unless --max-failures says otherwise


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python sweep.py", description=__doc__.splitlines()[0])
    p.add_argument("--space", help="YAML search space (see rpevit/sweep/space.py); required unless --fields")
    p.add_argument("--fields", action="store_true",
                   help="list every config field a space's fixed / grid / sample or --set may give, by section, "
                        "with its help, default and allowed values, and exit")
    p.add_argument("--name", default=None, help="sweep name (default: the space's name); one folder name")
    p.add_argument("--results-dir", default="results", help="results go to <dir>/<name>/")
    p.add_argument("--data-dir", default=None, help="folder of <dataset>.npz (default $RPEVIT_DATA or ./data)")
    p.add_argument("--resume", action="store_true", help="continue the sweep in <results-dir>/<name>")
    p.add_argument("--retry-failed", action="store_true", help="with --resume: rerun failed trials too")
    p.add_argument("--redeclare", action="store_true",
                   help="record the space's changed `declare:` block although trials ran; every row that started "
                        "before it becomes exploratory (rpevit/sweep/declaration.py)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the trial table, the values every trial runs with (after --set), the data each "
                        "dataset reads, GPU needs this machine lacks and an estimate from measured rows, and exit")
    p.add_argument("--deadline", default=None, metavar="WHEN",
                   help="start only trials predicted to end before WHEN; running ones finish, the rest wait for "
                        "--resume: 2026-11-23T18:00 (ISO 8601; local time unless it has an offset like +01:00 or Z), "
                        "18:00 (today, local time), or minutes from now: 90m, 90 (also 1.5h)")
    p.add_argument("--deadline-estimate", type=float, default=None, metavar="SECONDS",
                   help="with --deadline, while trials.parquet holds no finished trial of the task: seconds per "
                        "epoch of one Tune trial (per trial without epochs); without it, one trial runs first "
                        "and the rest is planned from its time")
    p.add_argument("--rungs-first", action="store_true",
                   help="budget ladders (`branch: epochs`): each trunk trains only to where its last shorter trial "
                        "branches and pauses there; every shorter trial runs; then the trunks continue from their "
                        "checkpoints. Same rows; every ladder's shorter budgets are answered first")
    p.add_argument("--max-trials", type=int, default=DEFAULT_MAX_TRIALS,
                   help=f"refuse spaces that expand to more trials (default {DEFAULT_MAX_TRIALS:,})")
    p.add_argument("--address", default=None,
                   help="join a Ray cluster: auto | host:port | ray://host:port for Ray Client (or set RAY_ADDRESS)")
    p.add_argument("--gpus-per-trial", type=float, default=None, help="fractions share a GPU (0.25: 4 per GPU)")
    p.add_argument("--cpus-per-trial", type=float, default=None)
    p.add_argument("--max-concurrent", type=int, default=None, help="0 = as many as the resources fit")
    p.add_argument("--max-failures", type=int, default=DEFAULT_MAX_FAILURES,
                   help="retries per trial, from its checkpoint (a diverged trial, NaN loss, is never retried: it "
                        "would replay the same steps)")
    p.add_argument("--reuse", action=argparse.BooleanOptionalAction, default=True,
                   help="run trial after trial in warm worker processes (default); --no-reuse: a fresh "
                        "process per trial (the old behaviour: seconds of start-up per trial)")
    p.add_argument("--dashboard", action=argparse.BooleanOptionalAction, default=True,
                   help="start Ray's dashboard on 127.0.0.1 (local Ray only)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a config field in every trial (repeatable, one value per field; not task; --fields "
                        "lists them)")
    p.add_argument("--only", dest="only", action="append", default=[], metavar="FIELD=VALUE",
                   help="run only the trials whose config has this value (repeatable: all must hold), e.g. "
                        "--only dataset=cifar10 for one half of all12.yaml; trial keys stay the whole space's")
    return p


def check_options(args: argparse.Namespace, space: Space) -> None:
    """What the space alone cannot know, checked before the dry run prints its table."""
    resources = space.resources.with_overrides(args.cpus_per_trial, args.gpus_per_trial, args.max_concurrent,
                                               space.source)
    check_results_dir(args.results_dir, space.name)
    for chosen in ([args.data_dir] if args.data_dir is not None else []) + [t["data_dir"] for t in space.trials]:
        if "\0" in chosen:
            where = "--data-dir" if chosen == args.data_dir else "field 'data_dir'"
            raise ConfigError(f"{where} has value {chosen!r}, which holds a NUL character; allowed: a folder path "
                              f"without NUL characters")
    if args.data_dir is not None:
        from rpevit.data import FOLDERLESS_DATASETS

        folder = Path(args.data_dir).expanduser()
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"--data-dir has value {args.data_dir!r}, which is a file; allowed: a folder "
                              f"holding <dataset>.npz")
        if all(t["dataset"] in FOLDERLESS_DATASETS for t in space.trials):
            raise ConfigError(f"--data-dir has value {args.data_dir!r} but no trial reads a data folder (dataset "
                              f"{', '.join(FOLDERLESS_DATASETS)} is bundled with scikit-learn); allowed: leave "
                              f"--data-dir out")
    check_address(args.address)  # its form (auto, host:port); whether a head answers: when Ray starts
    local = is_local(args)
    refusal = dry_run.cpu_refusal(resources, local)  # a trial bigger than this machine: before Ray starts, not after
    if refusal and not args.dry_run:  # a dry run says it among its lines (dry_run.describe)
        raise ConfigError(refusal)
    if local and not args.dry_run:  # a dry run says it (dry_run.data_lines)
        dry_run.check_data(space, args.data_dir)  # a file a trial would refuse: refused before anything starts
        dry_run.fetch_missing(space, args.data_dir)  # a missing file: fetched once here, or one line if it cannot be
    if local and any(t["device"] == "cuda" for t in space.trials):
        import torch

        if not torch.cuda.is_available():
            raise ConfigError("field 'device' has value 'cuda' but torch sees no CUDA device on this machine, "
                              "where the local Ray runs the trials; allowed: cpu, auto (or --address a cluster "
                              "with GPUs)")


def is_local(args: argparse.Namespace) -> bool:
    """The trials run on this machine (an embedded Ray), not on a cluster joined by --address / $RAY_ADDRESS."""
    return not (args.address or os.environ.get("RAY_ADDRESS"))


def check_results_dir(results_dir: str, name: str) -> None:
    """--results-dir must be (or become) a writable folder: found out now, not after the dry run
    passed and the lock folder cannot be made. Nothing is created here."""
    allowed = "a folder this user can write (created if missing)"
    if not results_dir.strip():  # '' would put the results in the current folder
        raise ConfigError(f"--results-dir has value {results_dir!r}; allowed: {allowed}, named (not empty)")
    try:
        folder = sweep_dir(results_dir, name)
    except (OSError, ValueError) as err:
        raise ConfigError(f"--results-dir has value {results_dir!r}, which cannot be used ({err}); allowed: "
                          f"{allowed}") from err
    existing = next(p for p in (folder, *folder.parents) if p.exists())  # what mkdir would start from
    if not existing.is_dir():
        raise ConfigError(f"--results-dir has value {results_dir!r}, but {existing} is a file; allowed: {allowed}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--results-dir has value {results_dir!r}, but {existing} is not writable by this user; "
                          f"allowed: {allowed}")


def resume_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """The flags repeated in the printed --resume and --retry-failed commands: those that decide which trials the
    space holds (--set, --only, --max-trials) and the order they run in (--rungs-first), then those that say where
    and how they run (--address, the per-trial resources, --max-concurrent, --max-failures, --no-reuse,
    --no-dashboard), so that the command pasted on a cluster's head joins the same cluster with the same
    retries. Not repeated: --deadline and --deadline-estimate (the deadline variant asks for a new deadline;
    an estimate belongs to the run it was given for), --redeclare and --dry-run."""
    flags = [*(f for item in args.overrides for f in ("--set", item)),
             *(f for item in args.only for f in ("--only", item))]
    if args.rungs_first:
        flags.append("--rungs-first")
    if args.max_trials != DEFAULT_MAX_TRIALS:
        flags += ["--max-trials", str(args.max_trials)]
    if args.address is not None:
        flags += ["--address", args.address]
    for flag, value in (("--cpus-per-trial", args.cpus_per_trial), ("--gpus-per-trial", args.gpus_per_trial)):
        if value is not None:
            flags += [flag, f"{value:g}"]
    if args.max_concurrent is not None:
        flags += ["--max-concurrent", str(args.max_concurrent)]
    if args.max_failures != DEFAULT_MAX_FAILURES:
        flags += ["--max-failures", str(args.max_failures)]
    flags += [flag for flag, on in (("--no-reuse", args.reuse), ("--no-dashboard", args.dashboard)) if not on]
    return tuple(flags)


def print_fields() -> None:
    """The config fields by section, one line each: what `python -m rpevit.cli --help` shows as flags."""
    from rpevit.config import field_help, section_fields

    for section, names in section_fields().items():
        print(f"{section}:")
        for name in names:
            print(f"  {name:<18} {field_help(name)}")


def main(argv: list[str] | None = None) -> int:
    """The command line; the exit status (module docstring). SIGTERM at any moment: 143 after one line
    (rpevit.sigterm), even where Ray turned the unwinding into another exit."""
    sigterm.imports_done()  # from here a SIGTERM unwinds (Ray, the lock) instead of exiting at once
    try:
        return run(argv)
    except KeyboardInterrupt:  # Ctrl-C outside the trials' run (the runner says what a run's Ctrl-C stopped)
        if sigterm.received():
            return sigterm.EXIT_CODE
        print("\ninterrupted (Ctrl-C); rows and checkpoints written so far are kept: --resume continues (exit 130)",
              file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT
    except BaseException:
        if sigterm.received():
            return sigterm.EXIT_CODE
        raise


def run(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.fields:
        print_fields()
        return 0
    if args.space is None:
        parser.error("the following arguments are required: --space (or --fields)")
    try:
        if args.max_trials < 1:
            raise ConfigError(f"--max-trials has value {args.max_trials}; allowed: an integer >= 1")
        if args.max_failures < 0:  # Tune would read a negative count as "retry forever"
            raise ConfigError(f"--max-failures has value {args.max_failures}; allowed: an integer >= 0 (retries per "
                              f"trial; 0 = none)")
        deadline = parse_deadline(args.deadline) if args.deadline is not None else None  # minutes: from now
        check_estimate(args.deadline_estimate, deadline)
        if args.retry_failed and not args.resume:
            raise ConfigError("--retry-failed is given without --resume; allowed: only with --resume (it reruns the "
                              "failed trials of the sweep it continues)")
        if args.name is not None:
            check_name(args.name, "--name")
        space = load_space(args.space, overrides=parse_overrides(args.overrides), max_trials=args.max_trials,
                           only=parse_overrides(args.only, flag="--only"))
        if args.name:
            space.name = args.name
        if args.redeclare and space.declaration is None:
            raise ConfigError(f"--redeclare is given but {args.space} has no declare: block; allowed: only for a "
                              f"space with a declare: block (the one it records)")
        check_options(args, space)
        check_rungs_first(space, args.rungs_first, deadline)
        print(space.table())
        dropped = f" ({space.duplicates_dropped} duplicates dropped)" if space.duplicates_dropped else ""
        print(f"{len(space.trials)} trials{dropped} in sweep {space.name!r} from {args.space}")
        if args.dry_run:
            resources = space.resources.with_overrides(args.cpus_per_trial, args.gpus_per_trial, args.max_concurrent,
                                                       space.source)
            for line in dry_run.describe(space, parse_overrides(args.overrides), resources,
                                         results_dir=args.results_dir, data_dir=args.data_dir, resume=args.resume,
                                         local=is_local(args), rungs_first=args.rungs_first):
                print(line)
            if deadline is not None:
                print(f"deadline {deadline.describe()}")
            return 0
        from rpevit.sweep.runner import SweepOptions, run_sweep  # Ray, torch, Tune: not for dry runs

        opts = SweepOptions(results_dir=args.results_dir, data_dir=args.data_dir, resume=args.resume,
                            retry_failed=args.retry_failed, address=args.address,
                            cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial,
                            max_concurrent=args.max_concurrent, dashboard=args.dashboard,
                            max_failures=args.max_failures, reuse=args.reuse, deadline=deadline,
                            deadline_estimate=args.deadline_estimate, resume_flags=resume_flags(args),
                            redeclare=args.redeclare, rungs_first=args.rungs_first)
        return run_sweep(space, opts)  # takes the sweep lock before Ray starts: a second driver stops at once
    except ConfigError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # ended by os._exit once Ray is shut down and the output flushed (rpevit.tool_exit)
    from rpevit.tool_exit import run_tool  # noqa: E402

    run_tool(main)
