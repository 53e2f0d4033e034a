"""A fused seed group: k `train` trials that differ only in their seed, trained as one model.

One process, one data copy, one stacked model (rpevit.models.stacked): every kernel of a step runs
once for all k members instead of k times, which is what a launch-bound GPU needs
(docs/fused_groups.md). The members run through the one training loop (tasks/train.py,
`train_members`), as a solo trial does, so each keeps everything it has when run alone: its initial
weights, its data order and augmentation, its stochastic-depth masks (tasks/generators.py), its
random-feature draws and redraws, its gradient clipping (its own norm), its AdamW state and schedule,
its draw-aware evaluation, its checkpoint (in the solo layout, so either can continue the other's)
and its own summary row. A member whose loss diverges is recorded as failed at the end of that
epoch, as a solo run would fail; the others go on. tests/test_fused_group.py proves a fused group
equal to its solo runs in float64.

Members of a mechanism that cannot run under vmap (`vmap_blockers`: the sparse CG Cayley solve)
are stepped one after another in the same loop (tasks/steppers.py); the log says so.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from rpevit import checkpoint
from rpevit.config import ConfigError, TrialConfig
from rpevit.registry import register_group_task
from rpevit.tasks.grouping import check_group
from rpevit.tasks.train import MemberEpoch, Outcome, resolve_device, train_members


@register_group_task("train")
def train_group(cfgs: list[TrialConfig], *, checkpoint_dirs: list[str | Path | None] | None = None,
                on_epoch: MemberEpoch | None = None, log: Callable[[str], None] | None = print) -> list[Outcome]:
    """Train the members together; returns, per member, its summary row or the exception it failed with.

    Members whose checkpoints stand at different epochs are trained as sub-groups, one after another.
    A checkpoint that does not match its member's config fails that member only.
    """
    check_group(cfgs)
    dirs = list(checkpoint_dirs) if checkpoint_dirs is not None else [None] * len(cfgs)
    outcomes: list[Outcome | None] = [None] * len(cfgs)
    opened: dict[int, tuple[Path | None, dict | None]] = {}
    for i, (cfg, folder) in enumerate(zip(cfgs, dirs)):
        try:  # a checkpoint of another device kind fails its member only, as a foreign one does
            path, state = opened_i = checkpoint.open_for_resume(folder, cfg)
            if state is not None:
                checkpoint.check_device(state, resolve_device(cfg.device).type, path)
            opened[i] = opened_i
        except ConfigError as err:
            outcomes[i] = err
    by_start: dict[int, list[int]] = {}
    for i, (_, state) in opened.items():
        by_start.setdefault(int(state["epoch"]) if state else 0, []).append(i)
    for start in sorted(by_start):
        members = by_start[start]
        results = train_members([cfgs[i] for i in members], [opened[i] for i in members],
                                on_epoch=(lambda j, row, folder, _m=members: on_epoch(_m[j], row, folder))
                                if on_epoch else None, log=log, tagged=True)
        for i, result in zip(members, results):
            outcomes[i] = result
    return outcomes  # type: ignore[return-value]


__all__ = ["train_group"]
