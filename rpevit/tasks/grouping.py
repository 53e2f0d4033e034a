"""What may train as one fused group (`fuse: seeds`): k `train` trials of one recipe, distinct seeds.

The rule apart from the group's training loop (train_group.py), so that a space checks its groups
when it is loaded (rpevit.sweep.space) without importing that loop; the loop checks its members again.
"""
from __future__ import annotations

from dataclasses import fields

from rpevit.config import ConfigError, TrialConfig

GROUP_FIELDS = ("seed",)  # the config fields that may differ between the members of one group


def check_group(cfgs: list[TrialConfig]) -> None:
    """Refuse a group that is not k runs of one recipe: fields other than GROUP_FIELDS must agree,
    and nothing may draw random numbers inside the forward (dropout: vmap cannot give each member
    its own generator there)."""
    if not cfgs:
        raise ConfigError("a fused group needs at least one member")
    first = cfgs[0].to_dict()
    for cfg in cfgs[1:]:
        differ = [f.name for f in fields(TrialConfig)
                  if f.name not in GROUP_FIELDS and getattr(cfg, f.name) != first[f.name]]
        if differ:
            raise ConfigError(f"fused group: field {differ[0]!r} has value {getattr(cfg, differ[0])!r} in one member "
                              f"and {first[differ[0]]!r} in another; allowed: members that differ only in "
                              f"{', '.join(GROUP_FIELDS)}")
    if cfgs[0].task != "train":
        raise ConfigError(f"fused group: field 'task' has value {cfgs[0].task!r}; allowed: train")
    if cfgs[0].dropout > 0:
        raise ConfigError(f"fused group: field 'dropout' has value {cfgs[0].dropout!r}; allowed: 0 in a fused group "
                          f"(dropout draws inside the forward, where members cannot have their own generators); "
                          f"run these trials without `fuse: seeds`")
    seeds = [cfg.seed for cfg in cfgs]
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"fused group: field 'seed' has values {seeds}; allowed: distinct seeds")


__all__ = ["GROUP_FIELDS", "check_group"]
