"""Learning-rate schedules of the train task (solo and fused): a linear warm-up, then cosine decay to 0,
or warm-up / stable / decay (`lr_schedule: wsd`), whose runs of several lengths share everything
before their cool-downs (rpevit.tasks.budget_ladder). Each is a multiplier per step for LambdaLR."""
from __future__ import annotations

import math
from typing import Callable

from rpevit.config import TrialConfig

WARMUP_MAX_FRACTION = 0.1  # warm-up never takes more than 10% of the training steps


def warmup_steps_for(cfg: TrialConfig, steps_per_epoch: int, total_steps: int) -> int:
    """The recipe's warm-up, capped at WARMUP_MAX_FRACTION of the run so the schedule always decays
    (a 5-epoch CIFAR warm-up in a 4-epoch run would otherwise end at peak lr)."""
    wanted = round(cfg.resolved_warmup_epochs * steps_per_epoch)
    return max(1, min(wanted, round(WARMUP_MAX_FRACTION * total_steps)))


def warmup_cosine(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """Linear warm-up to the base lr, then cosine decay to zero at the last step."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def cooldown_start(total_steps: int, cooldown_fraction: float) -> int:
    """The first step of a wsd cool-down: the last round(cooldown_fraction x total_steps) steps decay."""
    return total_steps - round(cooldown_fraction * total_steps)


def warmup_stable_decay(total_steps: int, warmup_steps: int, cooldown_fraction: float) -> Callable[[int], float]:
    """Linear warm-up, the peak lr until `cooldown_start`, then 1 - sqrt(progress) to zero at the end.

    Why: until its cool-down begins, a run does not depend on its length, so runs of several budgets
    share that stretch exactly and each shorter budget branches off the longest run at its own
    cool-down start (docs/budget_ladder.md). The 1-sqrt shape is the cool-down Hagele et al. (2024,
    "Scaling laws and compute-optimal training beyond fixed training durations") found to match a
    cosine run of the same length; the factor is exactly 1 at the cool-down's first step, the value
    the stable phase left in the optimizer."""
    decay_from = max(warmup_steps, cooldown_start(total_steps, cooldown_fraction))

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if step < decay_from:
            return 1.0
        return 1.0 - math.sqrt(min(1.0, (step - decay_from) / max(1, total_steps - decay_from)))

    return factor


def lr_factor(cfg: TrialConfig, steps_per_epoch: int, total_steps: int) -> Callable[[int], float]:
    """The learning-rate multiplier per step of `cfg.lr_schedule` (LambdaLR), warm-up included."""
    warmup_steps = warmup_steps_for(cfg, steps_per_epoch, total_steps)
    if cfg.lr_schedule == "wsd":
        return warmup_stable_decay(total_steps, warmup_steps, cfg.cooldown_fraction)
    return warmup_cosine(total_steps, warmup_steps)
