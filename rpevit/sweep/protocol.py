"""The two messages of a sweep, typed: what the runner hands a trial, and what a trial reports back.

Driver (launch_plan.py, tune_run.py, writer.py) and worker (trainable.py) run in different processes and talk
through Tune: the runner puts one `TrialSpec` per Tune trial into Tune's config under `SPEC_KEY`,
and the trial sends `Report`s through `tune.report`, which the driver's ParquetResults callback
reads back. Tune carries plain dicts (its experiment state, dashboard and retries copy them), so
each record converts to a dict at the boundary and is rebuilt on the other side; nothing else in
the package spells those keys.

    launch_plan.tune_trials -> TrialSpec.to_dict() -> Tune -> TrialSpec.from_tune_config() -> trainable
    trainable -> Report(...).to_tune() -> tune.report -> Report.from_tune() -> ParquetResults
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Optional

from rpevit.sweep.space import Timing

SPEC_KEY = "trial"  # the one key of a Tune trial's config
TUNE_METRIC = "val_acc"  # the number each report also carries flat, for Tune's progress and dashboard

Status = Literal["ok", "failed"]
OK: Status = "ok"  # the `status` column of trials.parquet
FAILED: Status = "failed"

RowKind = Literal["epoch", "summary", "failed", "note", "paused"]
EPOCH: RowKind = "epoch"  # one epoch row of a running trial (epochs.parquet)
SUMMARY: RowKind = "summary"  # the trial's result row (trials.parquet, status ok)
VARIANT_FAILED: RowKind = "failed"  # failed without its Tune trial raising: fused or interleaved member, divergence
NOTE: RowKind = "note"  # a line for the sweep's output (`error` holds it): something the trial did without
PAUSED: RowKind = "paused"  # a trunk stopped at its last branch (--rungs-first): no row yet, continued next round


@dataclass(frozen=True)
class Member:
    """One sweep trial: its key in the space, a readable label and its full TrialConfig dict."""

    trial_key: str
    label: str
    cfg: dict[str, Any]


@dataclass(frozen=True)
class TrialSpec:
    """What one Tune trial runs (built by launch_plan.tune_trials).

    `members` holds one sweep trial, except in an interleaved timing trial (every pending variant,
    timed in rounds in one worker), in a fused group (`fused`: the seeds of one recipe, trained as
    one stacked model, see rpevit.tasks.train_group) and in a warm-up trial (none: it only holds its
    worker until every slot has one, see trainable.wait_for_workers, and names the `barrier` actor).
    """

    name: str
    members: tuple[Member, ...] = ()
    checkpoint_root: str = ""  # trial checkpoints live in <checkpoint_root>/<trial_key>/
    cpus_per_trial: float = 1.0  # the trial's torch threads
    gpus_per_trial: float = 0.0
    reserved_cpus: float = 0.0  # CPUs the trial holds (a whole node for timing tasks)
    timing: Optional[Timing] = None  # set for timing tasks only
    barrier: str = ""  # warm-up trials only: the StartBarrier actor's name
    fused: bool = False  # the members train as one fused group (space `fuse: seeds`)
    # budget ladders (space `branch: epochs`): the shorter trials this one is the trunk of; it writes each
    # one's checkpoint at its cool-down start (rpevit.tasks.budget_ladder); they run as trials of their own
    branches: tuple[Member, ...] = ()
    pause_at_branch: bool = False  # --rungs-first: the trunk stops after its last branch's epoch (no row yet)

    def to_dict(self) -> dict[str, Any]:
        """The plain dict Tune carries: one grid point of the `SPEC_KEY` search space."""
        return asdict(self)

    @classmethod
    def from_tune_config(cls, config: dict[str, Any]) -> "TrialSpec":
        """Rebuild from a Tune trial's config ({SPEC_KEY: to_dict()})."""
        values = dict(config[SPEC_KEY])
        values["members"] = tuple(Member(**m) for m in values.get("members", ()))
        values["branches"] = tuple(Member(**m) for m in values.get("branches", ()))
        if values.get("timing") is not None:
            values["timing"] = Timing(**values["timing"])
        return cls(**values)


@dataclass(frozen=True)
class Report:
    """One message from a trial to the driver: an epoch row, the summary row, a failed variant, a note, or a
    trunk's pause (--rungs-first)."""

    kind: RowKind
    trial_key: str
    row: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    error: str = ""  # VARIANT_FAILED: "ExceptionType: message"; NOTE: the line
    traceback: str = ""

    def to_tune(self) -> dict[str, Any]:
        """The result dict for tune.report; `TUNE_METRIC` is repeated flat for Tune's progress."""
        metric = self.row.get("final_val_acc" if self.kind == SUMMARY else TUNE_METRIC, float("nan"))
        return {**asdict(self), TUNE_METRIC: metric}

    @classmethod
    def from_tune(cls, result: dict[str, Any]) -> Optional["Report"]:
        """The report inside a Tune result; None for results Tune makes itself (no `kind`)."""
        if result.get("kind") not in (EPOCH, SUMMARY, VARIANT_FAILED, NOTE, PAUSED):
            return None
        return cls(**{name: result[name] for name in ("kind", "trial_key", "row", "label", "error", "traceback")
                      if name in result})


def members_of(trial: Any) -> tuple[Member, ...]:
    """The sweep trials one Tune trial runs (none for a warm-up trial)."""
    return TrialSpec.from_tune_config(trial.config).members
