"""Run a sweep on Ray Tune: `python sweep.py --space search_spaces/smoke.yaml`.

The space is expanded and validated before anything runs (`--dry-run` shows the trial table).
Results land in <results-dir>/<name>/{trials,epochs}.parquet; `--resume` continues a killed
sweep. Exit code: 0 all trials ok, 1 some failed, 2 bad space or options.
"""
from __future__ import annotations

import argparse
import re
import sys

from rpevit.config import ConfigError
from rpevit.sweep.space import load_space, parse_overrides


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python sweep.py", description=__doc__.splitlines()[0])
    p.add_argument("--space", required=True, help="YAML search space (see rpevit/sweep/space.py)")
    p.add_argument("--name", default=None, help="sweep name (default: the space's name)")
    p.add_argument("--results-dir", default="results", help="results go to <dir>/<name>/")
    p.add_argument("--data-dir", default=None, help="folder of <dataset>.npz (default $RPEVIT_DATA or ./data)")
    p.add_argument("--resume", action="store_true", help="continue the sweep in <results-dir>/<name>")
    p.add_argument("--retry-failed", action="store_true", help="with --resume: rerun failed trials too")
    p.add_argument("--dry-run", action="store_true", help="print the trial table and exit")
    p.add_argument("--address", default=None, help="join a Ray cluster: auto | host:port (or set RAY_ADDRESS)")
    p.add_argument("--gpus-per-trial", type=float, default=None, help="fractions share a GPU (0.25: 4 per GPU)")
    p.add_argument("--cpus-per-trial", type=float, default=None)
    p.add_argument("--max-concurrent", type=int, default=None, help="0 = as many as the resources fit")
    p.add_argument("--max-failures", type=int, default=1, help="retries per trial, from its checkpoint")
    p.add_argument("--dashboard", action=argparse.BooleanOptionalAction, default=True,
                   help="start Ray's dashboard on 127.0.0.1 (local Ray only)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a config field in every trial (repeatable)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        space = load_space(args.space, overrides=parse_overrides(args.overrides))
        if args.name:
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.name):
                raise ConfigError(f"--name has value {args.name!r}; allowed: letters, digits, '_', '.', '-'")
            space.name = args.name
        print(space.table())
        dropped = f" ({space.duplicates_dropped} duplicates dropped)" if space.duplicates_dropped else ""
        print(f"{len(space.trials)} trials{dropped} in sweep {space.name!r} from {args.space}")
        if args.dry_run:
            return 0
        from rpevit.sweep.runner import SweepOptions, run_sweep  # imports Ray: not for dry runs

        opts = SweepOptions(results_dir=args.results_dir, data_dir=args.data_dir, resume=args.resume,
                            retry_failed=args.retry_failed, address=args.address,
                            cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial,
                            max_concurrent=args.max_concurrent, dashboard=args.dashboard,
                            max_failures=args.max_failures)
        return run_sweep(space, opts)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
