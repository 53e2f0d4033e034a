"""What a run of a sweep will do, decided before Ray starts: resume bookkeeping (which trials have
a row), the trials' configs as they run, the resources (the space's, with the command line's
overrides: Resources.with_overrides), and the space file the analysis reads.

Resume is our own bookkeeping, keyed by trial_key: trials with a row in trials.parquet are done
(failed ones too, unless retry_failed), every other trial is handed to a fresh Tuner and
continues from its checkpoint directory. This survives a SIGKILL of the driver at any moment
(no Tune experiment state needs to have been saved) and edits of unrelated code.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rpevit.checkpoint import CHECKPOINT_NAME
from rpevit.data import FOLDERLESS_DATASETS, resolve_data_dir
from rpevit.sweep import migrate
from rpevit.sweep.protocol import FAILED, OK
from rpevit.sweep.results import SPACE_FILE, TRIALS_FILE, select_keys, write_text_atomic
from rpevit.sweep.store import driver_trials
from rpevit.sweep.space import Resources, Space, SpaceError


@dataclass
class SweepPlan:
    """The trials this run handles and on what."""
    configs: list[dict[str, Any]]  # every trial's config as it runs (prepare_trials), in space order
    pending: list[int]  # indices into configs of the trials without a row yet
    resources: Resources  # the space's resources with the command line's overrides


def prepare_trials(space: Space, data_dir: str | None) -> list[dict[str, Any]]:
    """Trial configs as they run: data_dir made absolute (trials run with their own cwd); left
    empty for datasets that read no folder (digits), whose config refuses a data_dir."""
    out = []
    for cfg in space.trials:
        if cfg["dataset"] in FOLDERLESS_DATASETS:
            out.append(dict(cfg))
            continue
        chosen = data_dir or cfg["data_dir"] or None
        out.append({**cfg, "data_dir": str(resolve_data_dir(chosen))})
    return out


def plan_sweep(space: Space, out_dir: Path, *, resume: bool, retry_failed: bool, data_dir: str | None,
               resources: Resources) -> SweepPlan:
    """Refuse to overwrite a started sweep without resume; trials with a row of the current space
    are done (failed ones too, unless retry_failed); the rest are pending."""
    everything = driver_trials(out_dir)
    started = not everything.empty or any((out_dir / "trials").glob(f"*/{CHECKPOINT_NAME}"))
    if started and not resume:
        raise SpaceError(f"{out_dir} already holds results of sweep {space.name!r}; pass --resume to "
                         f"continue it, or choose another --name / --results-dir")
    if resume and not started:
        print(f"nothing to resume, starting: {out_dir} holds no results of sweep {space.name!r} yet", flush=True)
    previous, set_aside = select_keys(everything, space.current_keys)
    if set_aside:
        print(f"set aside {set_aside} row(s) of trials that are not in the current space (its YAML changed "
              f"since they ran): kept in {TRIALS_FILE}, not counted as done, not in the summary", flush=True)
    finished = set()
    if not previous.empty:
        keep = [OK] if retry_failed else [OK, FAILED]
        finished = set(previous.loc[previous["status"].isin(keep), "trial_key"])
    return SweepPlan(configs=prepare_trials(space, data_dir),
                     pending=[i for i, key in enumerate(space.keys) if key not in finished], resources=resources)


def write_space_file(out_dir: Path, space: Space) -> None:
    """space.json (atomically): the trial keys analysis uses to tell current rows from stale ones."""
    write_text_atomic(out_dir / SPACE_FILE, json.dumps({"name": space.name, "source": space.source,
                                                        "key_scheme": migrate.KEY_SCHEME,
                                                        "trial_keys": space.current_keys}, indent=1))
