"""The budget ladder: runs of one recipe at several budgets (epochs), each with its own fully decayed
schedule, for little more than the longest run costs alone.

Under `lr_schedule: wsd` a run is warm-up, a stable stretch at the peak learning rate, then a
cool-down over its last `cooldown_fraction` of steps. Until its cool-down starts, nothing in a run
depends on its length: data order, augmentation, drop-path masks and random-feature redraws are drawn
from seeded streams step by step, and the learning rate is the same. So the longest run (the trunk)
passes through the exact state every shorter run (a rung) has at its own cool-down start. The trunk
writes that state, at that epoch, as the rung's checkpoint; the rung then resumes from it like any
interrupted run and trains only its cool-down. The rung's row is the row a separate run gives
(tests/test_budget_ladder.py proves it equal to a separate run in float64), so it carries the
rung's own config and trial key, and a ladder and separate runs resume into one another.

The conditions, each refused with the field that breaks it:
- `lr_schedule: wsd` on every rung, with one `cooldown_fraction`;
- each rung's cool-down starts at an epoch boundary (`cooldown_fraction x epochs` a whole number),
  because checkpoints are written per epoch;
- the warm-up is the same number of steps in every rung (the recipe caps it at 10% of a run, so it
  must fit 10% of the shortest);
- random features stop being redrawn no earlier than the cool-down (`redraw_until >= 1 -
  cooldown_fraction`), else the rung would freeze its draw inside the shared stretch.

A space asks for it with `branch: epochs` (rpevit/sweep/space.py): trials that differ only in
`epochs` form one ladder; the longest pending one runs first and carries the others as branches
(rpevit/sweep/launch_plan.py). docs/budget_ladder.md says how to read a ladder's results.

`sweep.py --rungs-first` orders a ladder's work by what answers first: the trunk trains only to its last
branch point and pauses there (TrunkPaused: its checkpoint holds that epoch, no row), its rungs run, and
the trunk continues from that checkpoint in a second round. A pause is a resume at an epoch boundary,
which every trial already survives (tests/test_budget_ladder.py proves the paused-then-continued trunk
equal to an unpaused one in float64), so the rows are the rows of the default order. Why: the shorter
rungs of every ladder cost little more than half of the ladders' epochs (cifar10_ladder40_cpu: 22 of 46).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from rpevit import checkpoint
from rpevit.config import ConfigError, TrialConfig, field_error, resolve_values
from rpevit.tasks.schedule import WARMUP_MAX_FRACTION, cooldown_start, lr_factor

LADDER_FIELDS = ("epochs",)  # what may differ between the rungs of one ladder


@dataclass(frozen=True)
class Branch:
    """A shorter run to start from the trunk: its config, its checkpoint folder, and (once the trunk
    knows its steps per epoch) the trunk epoch after which its cool-down begins."""

    cfg: TrialConfig
    folder: Path
    epoch: int = 0


def check_ladder(cfgs: Sequence[TrialConfig], source: str = "space") -> None:
    """Refuse rungs that cannot share one trunk (the conditions of the module docstring), in epoch units,
    before anything trains; the trainer checks again in steps (branch_epoch). Compared resolved: a rung
    that leaves a field to its dataset's recipe and one that writes the recipe's value out share a trunk."""
    if not cfgs:
        return
    first = resolve_values(cfgs[0].to_dict())
    for cfg in cfgs[1:]:
        for name, value in resolve_values(cfg.to_dict()).items():
            if name not in LADDER_FIELDS and name != "data_dir" and value != first[name]:
                raise field_error(source, name, value, f"{first[name]!r}, the value of the other rungs of the ladder "
                                  f"(rungs differ only in {', '.join(LADDER_FIELDS)})")
    shortest = min(cfg.epochs for cfg in cfgs)
    for cfg in cfgs:
        if cfg.lr_schedule != "wsd":
            raise field_error(source, "lr_schedule", cfg.lr_schedule, "wsd in a budget ladder (`branch: epochs`): "
                              "a cosine run depends on its length from its first step")
        cooldown = cfg.cooldown_fraction * cfg.epochs
        if abs(cooldown - round(cooldown)) > 1e-9 or round(cooldown) < 1:
            raise field_error(source, "cooldown_fraction", cfg.cooldown_fraction,
                              f"a fraction that makes the cool-down of {cfg.epochs} epochs a whole number of epochs "
                              f"(>= 1) in a budget ladder: checkpoints, and so branches, are per epoch")
        if cfg.redraw_until < 1 - cfg.cooldown_fraction - 1e-12:
            raise field_error(source, "redraw_until", cfg.redraw_until,
                              f">= 1 - cooldown_fraction = {1 - cfg.cooldown_fraction:g} in a budget ladder: an "
                              f"earlier freeze would fall in the stretch the rungs share")
    warmup = cfgs[0].resolved_warmup_epochs
    if warmup > WARMUP_MAX_FRACTION * shortest + 1e-12:
        raise field_error(source, "warmup_epochs", cfgs[0].warmup_epochs,
                          f"at most {WARMUP_MAX_FRACTION:g} x the shortest budget ({shortest} epochs) = "
                          f"{WARMUP_MAX_FRACTION * shortest:g} in a budget ladder (resolved: {warmup:g}): a longer "
                          f"warm-up is cut to 10% of each run, so the rungs would not share it")


def branch_epoch(trunk: TrialConfig, rung: TrialConfig, steps_per_epoch: int) -> int:
    """The trunk epoch after which `rung`'s cool-down begins, checked in steps: the two schedules agree
    on every step before it, and the rung does not freeze its random features before it. Raises
    ConfigError naming the field otherwise."""
    check_ladder([trunk, rung], source=f"budget ladder ({rung.epochs}-epoch rung of a {trunk.epochs}-epoch trunk)")
    if rung.epochs >= trunk.epochs:
        raise field_error("budget ladder", "epochs", rung.epochs, f"fewer than the trunk's {trunk.epochs}")
    total, trunk_total = rung.epochs * steps_per_epoch, trunk.epochs * steps_per_epoch
    start = cooldown_start(total, rung.cooldown_fraction)
    if start % steps_per_epoch:
        raise field_error("budget ladder", "cooldown_fraction", rung.cooldown_fraction,
                          f"a cool-down that starts at an epoch boundary ({start} steps of {steps_per_epoch} per epoch)")
    ours, theirs = lr_factor(rung, steps_per_epoch, total), lr_factor(trunk, steps_per_epoch, trunk_total)
    differ = [s for s in range(start) if ours(s) != theirs(s)]
    if differ:
        raise field_error("budget ladder", "warmup_epochs", rung.warmup_epochs,
                          f"a warm-up both runs share (their learning rates differ from step {differ[0]})")
    if start > 0 and not (start - 1) < rung.redraw_until * total:
        raise field_error("budget ladder", "redraw_until", rung.redraw_until,
                          f"a freeze at or after the cool-down (step {start}), not inside the shared stretch")
    return start // steps_per_epoch


def ladder_branch_epoch(rung: dict[str, Any]) -> int:
    """The trunk epoch after which `rung` (a resolved config) branches, in epochs: its epochs less its
    cool-down's round(cooldown_fraction x epochs). branch_epoch proves, in steps, that a valid ladder's
    cool-down is a whole number of epochs, k; then |cooldown_fraction x epochs - k| <= 0.5 / steps_per_epoch,
    so rounding in epochs gives k. For planning (rpevit.sweep.deadline), where steps per epoch are not known."""
    epochs = int(rung["epochs"])
    return epochs - round(float(rung["cooldown_fraction"]) * epochs)


class TrunkPaused(Exception):
    """A trunk stopped, by request (`pause_at_branch`), after the last epoch a branch of it starts from: its
    checkpoint holds that epoch, and the next run of the same trial continues from it. Not a failure: the
    trial has no row yet, and its rungs can run."""

    def __init__(self, epoch: int, epochs: int) -> None:
        super().__init__(f"budget ladder: the trunk paused after epoch {epoch} of {epochs}, where its last rung "
                         f"branches (--rungs-first); it continues from its checkpoint once its rungs have run")
        self.epoch, self.epochs = epoch, epochs


def last_branch_epoch(trunk: TrialConfig, branches: Sequence[Branch], steps_per_epoch: int) -> int:
    """The trunk epoch after which the last of `branches` starts (0 without branches): where a trunk
    asked to pause at its branches stops, whether or not it still writes their checkpoints."""
    return max((branch_epoch(trunk, b.cfg, steps_per_epoch) for b in branches), default=0)


def plan_branches(trunk: TrialConfig, branches: Sequence[Branch], steps_per_epoch: int, start_epoch: int,
                  log: Callable[[str], None]) -> dict[int, list[Branch]]:
    """trunk epoch -> the branches to write after it. A branch this trunk cannot serve (its epoch is
    already behind a resumed trunk, or it already has a checkpoint of its own) is left to run on its
    own, which gives the same row, and the log says so."""
    out: dict[int, list[Branch]] = {}
    for branch in branches:
        epoch = branch_epoch(trunk, branch.cfg, steps_per_epoch)
        path = branch.folder / checkpoint.CHECKPOINT_NAME
        if path.exists() or path.is_symlink():  # first: also where this trunk wrote it before a pause or a kill
            log(f"budget ladder: the {branch.cfg.epochs}-epoch rung has a checkpoint of its own ({path}): it "
                f"continues from it")
        elif epoch < start_epoch or (epoch == start_epoch and start_epoch > 0):
            log(f"budget ladder: the {branch.cfg.epochs}-epoch rung branches after epoch {epoch}, which this trunk "
                f"(resumed after epoch {start_epoch}) has passed: it runs on its own")
        else:
            out.setdefault(epoch, []).append(Branch(branch.cfg, branch.folder, epoch))
    return out


def write_branches(due: Sequence[Branch], payload: Callable[[TrialConfig], dict[str, Any]],
                   log: Callable[[str], None]) -> None:
    """After the trunk epoch the branches in `due` start from: each rung's checkpoint, holding the trunk's
    state under the rung's config (never over a checkpoint the rung has meanwhile written itself, and never
    while the rung's own trial runs in its folder: checkpoint.claimed, taken without waiting)."""
    for branch in due:
        try:  # the rung's folder held for the write: a rung that is running there keeps it, and runs on its own
            with checkpoint.claimed(branch.folder, wait_s=0):
                path = checkpoint.prepare_dir(branch.folder)
                if path is None or path.exists():
                    continue
                checkpoint.save(path, payload(branch.cfg))
        except ConfigError as err:
            log(f"budget ladder: no branch for the {branch.cfg.epochs}-epoch rung ({err}): it runs on its own")
            continue
        log(f"budget ladder: wrote the {branch.cfg.epochs}-epoch rung's checkpoint after epoch {branch.epoch} "
            f"({path}); it resumes there and trains its {branch.cfg.epochs - branch.epoch}-epoch cool-down")


def ladder_cost(budgets: Sequence[int], cooldown_fraction: float) -> float:
    """Epochs a ladder trains in all: the longest budget plus every shorter one's cool-down."""
    budgets = sorted(budgets)
    return float(budgets[-1] + sum(cooldown_fraction * b for b in budgets[:-1])) if budgets else math.nan


__all__ = ["Branch", "LADDER_FIELDS", "TrunkPaused", "branch_epoch", "check_ladder", "ladder_branch_epoch",
           "ladder_cost", "last_branch_epoch", "plan_branches", "write_branches"]
