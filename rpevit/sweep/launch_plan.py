"""What a run launches, decided without Ray (Hydra's sweeper apart from its launcher): the pending
trials (plan.py) as Tune trials, what each reserves, how many run at once, and with --deadline which
of them a round starts. tune_run.py turns a `Launch` into Tune trials and runs them; `sweep.py
--dry-run` estimates from the same Tune trials, so the groups it plans are the groups that run.

- The Tune trials (`tune_trials`): one per pending trial, except one per group of pending seeds of
  one recipe (`fuse: seeds`, Space.groups), one for every pending variant of an interleaved timing
  space (rounds inside one worker), and each budget ladder's trunk carrying its shorter trials
  (`branch: epochs`, Space.ladders), which Tune starts after it (`branches_after_their_trunks`).
- Resources (`bundle`, `slots_on`): a Tune trial reserves its CPUs and GPUs, a timing trial the
  whole of the largest node that has its GPUs (`node_cpus`); slots are the bundles that fit on the
  nodes, capped by max_concurrent and the number of Tune trials. Nodes are plain resource mappings
  (`Node`): the launcher reads them from the started Ray, the dry run describes this machine.
- The deadline (`plan_deadline_round`): which Tune trials of the pending ones end before it on the
  slots (rpevit.sweep.deadline.plan_units), as a Launch of the admitted ones and the trials left.
- Rungs first (`pause_trunks`, `check_rungs_first`; sweep.py --rungs-first): a first round in which
  each trunk stops after its last branch's epoch and its shorter trials run (a trunk whose shorter
  trials all have rows waits), then a second round of the paused trunks alone
  (tune_run.run_sweep_trials), so every shorter rung of every ladder is answered before any trunk
  trains past its last branch point. Same rows (rpevit/tasks/budget_ladder.py).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from rpevit.sweep import deadline as deadlines
from rpevit.sweep.plan import SweepPlan
from rpevit.sweep.protocol import Member, TrialSpec
from rpevit.sweep.space import Resources, Space
from rpevit.sweep.summary import DeadlineReport
from rpevit.tasks.budget_ladder import ladder_branch_epoch

Node = Mapping[str, float]  # one live node's resources, as Ray lists them: {"CPU": 16.0, "GPU": 2.0}


@dataclass(frozen=True)
class Launch:
    """The Tune trials one run (or one deadline round) starts, in the order Tune is given them."""

    specs: list[TrialSpec]
    bundle: dict[str, float]  # the placement bundle each Tune trial reserves
    slots: int  # how many run at once
    max_concurrent: int = 0  # Tune's cap (resources.max_concurrent; 0: as many as the resources fit)

    @property
    def reserved_cpus(self) -> float:
        return self.bundle["CPU"]

    def trial_indices(self, space: Space) -> list[int]:
        """The sweep trials these Tune trials report rows for, in space order."""
        index = {key: i for i, key in enumerate(space.keys)}
        return sorted(index[m.trial_key] for spec in self.specs for m in spec.members)

    def trial_configs(self, space: Space) -> dict[str, dict[str, Any]]:
        """trial_key -> config of the sweep trials these Tune trials report rows for, in space order."""
        configs = {m.trial_key: m.cfg for spec in self.specs for m in spec.members}
        return {space.keys[i]: configs[space.keys[i]] for i in self.trial_indices(space)}


def plan_launch(space: Space, plan: SweepPlan, checkpoint_root: Path, nodes: Sequence[Node] | None,
                pending: Sequence[int] | None = None) -> Launch:
    """The Tune trials of the pending trials (default: the plan's) on `nodes`. Without nodes (nothing is
    started from such a plan: a dry run away from the cluster, the check before Ray starts) a timing
    trial reserves its own CPUs and the slots are max_concurrent, else one per Tune trial."""
    res = plan.resources
    reserved, bundle_ = bundle(space, res, nodes)
    specs = tune_trials(space, plan.configs, list(plan.pending if pending is None else pending),
                        checkpoint_root=checkpoint_root, cpus=res.cpus_per_trial, gpus=res.gpus_per_trial,
                        reserved_cpus=reserved)
    slots = slots_on(nodes, bundle_, res.max_concurrent, len(specs)) if nodes is not None else \
        res.max_concurrent or len(specs)
    if space.branch is not None:
        specs = branches_after_their_trunks(specs, slots)
    return Launch(specs, bundle_, slots, res.max_concurrent)


def branches_after_their_trunks(specs: Sequence[TrialSpec], slots: int, lag: int | None = None) -> list[TrialSpec]:
    """The Tune trials of budget ladders in the order Tune starts them: the trunks (and lone trials) in
    the space's order, each ladder's shorter trials `lag` (default `slots - 1`) trunks after its own trunk,
    the last ones at the end. Why: a space lists its priority first (cifar10_ladder_cpu: softmax and FAVOR+, then
    Performer-ReLU), and a partial ladder must answer that first at every rung; with every trunk first,
    the 5- and 10-epoch rungs of the first ladders waited for the last ladder's trunk. Why the lag: a
    shorter trial resumes from the checkpoint its trunk writes at the start of its cool-down; on one slot
    the trunk has ended when the next Tune trial starts, and on `slots` slots a slot has freed `slots - 1`
    trunks later. One that starts before its checkpoint exists still gives its row, at full cost
    (rpevit/tasks/budget_ladder.py)."""
    trunk_of = {m.trial_key: spec.members[0].trial_key for spec in specs for m in spec.branches}
    shorter: dict[str, list[TrialSpec]] = {}
    for spec in specs:
        if spec.members[0].trial_key in trunk_of:
            shorter.setdefault(trunk_of[spec.members[0].trial_key], []).append(spec)
    first = [spec for spec in specs if spec.members[0].trial_key not in trunk_of]
    lag, out = (max(slots, 1) - 1 if lag is None else lag), []
    for i, spec in enumerate(first):
        out.append(spec)
        if i >= lag:
            out.extend(shorter.pop(first[i - lag].members[0].trial_key, []))
    for spec in first:  # the last `lag` ladders' shorter trials
        out.extend(shorter.pop(spec.members[0].trial_key, []))
    return out


def check_rungs_first(space: Space, rungs_first: bool, deadline: object) -> None:
    """--rungs-first is for a space of budget ladders (`branch: epochs`), and without --deadline (whose rounds
    admit whole trials by their estimates): ConfigError naming the flag otherwise."""
    from rpevit.config import ConfigError

    if not rungs_first:
        return
    if space.branch is None:
        raise ConfigError(f"--rungs-first is given but space {space.name!r} has no `branch: epochs`; allowed: only "
                          f"for a space of budget ladders (leave --rungs-first out)")
    if deadline is not None:
        raise ConfigError("--rungs-first is given with --deadline; allowed: one of the two (a deadline round admits "
                          "whole trials by their estimates, and a paused trunk is not one)")


def pause_trunks(launch: Launch, space: Space) -> tuple[Launch, list[str]]:
    """--rungs-first, round 1: the same Tune trials in the same order, each trunk carrying branches stopping
    after the epoch its last branch starts from (TrialSpec.pause_at_branch), less the trunks of ladders whose
    shorter trials all have rows already; those are returned by key, for the round after, with the paused
    ones. Why the hold: a trunk with no pending branch has nothing to pause for, so in round 1 it would train
    to its own budget in its place; a --resume of round 1 (every stop of a long study) would then first
    continue every trunk paused before the stop, ahead of the rungs of every ladder not yet begun."""
    trunks = {space.keys[ladder[0]] for ladder in space.ladders() if len(ladder) > 1}
    held = [spec.members[0].trial_key for spec in launch.specs
            if not spec.branches and all(m.trial_key in trunks for m in spec.members)]
    first = [replace(s, pause_at_branch=True) if s.branches else s for s in launch.specs
             if s.members[0].trial_key not in held]
    # ordered again without them: a held trunk counted in a ladder's lag would leave its shorter trials right
    # behind their own trunk, so on two slots they would start beside it, before its checkpoint, at full cost.
    # And one trunk later than the default order on more than one slot: a paused trunk writes its last branch's
    # checkpoint as it pauses, so trunks started together pause within seconds of each other in either order;
    # with the default lag the slot the first frees started the other's rung, before that checkpoint, at full
    # cost (cifar10_ladder40_cpu, 2026-11-29: a 20-epoch rung trained from epoch 0 because its trunk paused 9 s
    # after its neighbour). One more trunk between them gives the slot that frees first a trunk to start.
    lag = launch.slots if launch.slots > 1 else 0
    return replace(launch, specs=branches_after_their_trunks(first, launch.slots, lag)), held


def tune_trials(space: Space, configs: list[dict[str, Any]], pending: list[int], *, checkpoint_root: Path | str,
                cpus: float, gpus: float, reserved_cpus: float) -> list[TrialSpec]:
    """The Tune trials (grid points) for the pending trials: one each, except that an interleaved
    timing space runs all its pending variants in one Tune trial (rounds inside one worker), and a
    `fuse: seeds` space one per group of pending seeds of one recipe (space.groups)."""
    member = {i: Member(space.keys[i], space.label(i), configs[i]) for i in pending}
    timing = space.timing if space.exclusive else None
    if timing and timing.interleave:
        groups = [[member[i] for i in pending]]
    else:
        groups = [[member[i] for i in g] for g in space.groups(pending)]
    fused = space.fuse is not None
    branches: dict[str, tuple[Member, ...]] = {}
    if space.branch is not None:  # each ladder's longest pending trial first, carrying the shorter ones
        ladders = space.ladders(pending)
        branches = {space.keys[ladder[0]]: tuple(member[i] for i in ladder[1:]) for ladder in ladders}
        trunks = [[member[ladder[0]]] for ladder in ladders]
        groups = trunks + [g for g in groups if g[0].trial_key not in branches]
    return [TrialSpec(name=_spec_name(g, fused, timing), members=tuple(g), checkpoint_root=str(checkpoint_root),
                      cpus_per_trial=cpus, gpus_per_trial=gpus, reserved_cpus=reserved_cpus, timing=timing,
                      fused=fused, branches=branches.get(g[0].trial_key, ())) for g in groups]


def _spec_name(members: list[Member], fused: bool, timing: Any) -> str:
    """The Tune trial's name and folder: the sweep trial's key, or what a group holds."""
    if fused:
        seeds = "-".join(str(m.cfg["seed"]) for m in members)
        return f"fused-{members[0].trial_key}-seeds-{seeds}"[:120]
    return members[0].trial_key if len(members) == 1 else f"interleaved-{len(members)}-{members[0].trial_key}"


def deadline_units(specs: Sequence[TrialSpec]) -> list[deadlines.Unit]:
    """Each Tune trial as the deadline planner estimates it: its members, how they run together, and for a
    budget ladder's shorter trial, which Tune trial's trunk writes its checkpoint and after which epoch."""
    index = {spec.members[0].trial_key: i for i, spec in enumerate(specs)}
    trunk_of = {m.trial_key: index[spec.members[0].trial_key] for spec in specs for m in spec.branches}
    units = []
    for spec in specs:
        key, cfg = spec.members[0].trial_key, spec.members[0].cfg
        branch = len(spec.members) == 1 and key in trunk_of
        units.append(deadlines.Unit(tuple((m.trial_key, m.cfg) for m in spec.members),
                                    "fused" if spec.fused else "interleaved" if len(spec.members) > 1 else "single",
                                    branch_of=trunk_of[key] if branch else None,
                                    branch_epoch=ladder_branch_epoch(cfg) if branch else 0))
    return units


def rungs_first_units(space: Space, launch: Launch) -> tuple[list[deadlines.Unit], list[deadlines.Unit]]:
    """--rungs-first's two rounds as the planner estimates them (the dry run): round 1's Tune trials, each trunk
    stopping after its last branch's epoch, and round 2's, the paused and held trunks to their own budget."""
    first, held = pause_trunks(launch, space)
    one = deadline_units(first.specs)
    pause = {spec.members[0].trial_key: max(ladder_branch_epoch(b.cfg) for b in spec.branches)
             for spec in first.specs if spec.branches}
    one = [replace(u, pause_after=pause[u.members[0][0]]) if u.members[0][0] in pause else u for u in one]
    trunks = set(pause) | set(held)
    two = [replace(u, from_epoch=pause.get(u.members[0][0], 0))
           for u in deadline_units([s for s in launch.specs if s.members[0].trial_key in trunks])]
    return one, two


# ---- resources ----
def node_cpus(nodes: Sequence[Node], gpus: float) -> float:
    """CPUs of the largest node that has the trial's GPUs: what a timing trial reserves, so no other
    trial of the sweep shares its node (on a mixed cluster timing trials run on the largest such nodes
    only, which keeps their rows comparable)."""
    fitting = [n for n in nodes if n.get("GPU", 0.0) >= gpus] or list(nodes)
    return max((n.get("CPU", 0.0) for n in fitting), default=0.0)


def bundle(space: Space, res: Resources, nodes: Sequence[Node] | None) -> tuple[float, dict[str, float]]:
    """(CPUs a Tune trial reserves, its placement bundle): a timing trial reserves a whole node."""
    reserved = node_cpus(nodes, res.gpus_per_trial) if space.exclusive and nodes else res.cpus_per_trial
    return reserved, {"CPU": reserved, **({"GPU": res.gpus_per_trial} if res.gpus_per_trial > 0 else {})}


def slots_on(nodes: Sequence[Node], bundle_: Mapping[str, float], max_concurrent: int, n_trials: int) -> int:
    """How many Tune trials run at once: bundles that fit per node, summed, capped."""
    fit = sum(min(int(node.get(r, 0.0) / need + 1e-9) for r, need in bundle_.items() if need > 0) for node in nodes)
    return max(1, min(fit, max_concurrent or fit, n_trials))


# ---- the deadline ----
@dataclass(frozen=True)
class DeadlineRound:
    """One round of a --deadline run: the decision, the Tune trials it starts, the sweep trials it
    starts and leaves (indices into the space)."""

    decision: deadlines.DeadlinePlan
    launch: Launch
    admitted: list[int]
    left: list[int]


def plan_deadline_round(space: Space, plan: SweepPlan, out_dir: Path, deadline: deadlines.Deadline,
                        pending: Sequence[int], *, nodes: Sequence[Node] | None, probe: bool,
                        estimate_s: float | None = None, startup_s: float = deadlines.STARTUP_S,
                        slots: int | None = None, now: float | None = None) -> DeadlineRound:
    """Which Tune trials of the pending trials start in this round: those the estimates from the
    folder's rows (or `estimate_s`, --deadline-estimate) end before the deadline on the nodes' slots
    (`slots`: that many instead)."""
    everything = plan_launch(space, plan, out_dir / "trials", nodes, pending)
    estimator = deadlines.Estimator.from_folder(out_dir, space.task, estimate_s)
    decision = deadlines.plan_units(deadline_units(everything.specs), estimator,
                                    slots=everything.slots if slots is None else slots,
                                    now=time.time() if now is None else now, deadline=deadline,
                                    checkpoint_root=out_dir / "trials", probe=probe, startup_s=startup_s)
    started = [everything.specs[u] for u in decision.admitted]
    slots_now = slots_on(nodes, everything.bundle, plan.resources.max_concurrent, len(started)) \
        if nodes is not None else everything.slots
    launch = Launch(started, everything.bundle, slots_now, plan.resources.max_concurrent)
    admitted = launch.trial_indices(space)
    left = Launch([everything.specs[u] for u in decision.left], everything.bundle, 0).trial_indices(space)
    return DeadlineRound(decision, launch, admitted, left)


def deadline_plan_line(decision: deadlines.DeadlinePlan, admitted: Sequence[int], round_number: int = 1) -> str:
    """One line: how many Tune trials (and trials) start, when the last should end, the estimate."""
    units = len(decision.admitted) + len(decision.left)
    finish = (f", the last predicted to end at {time.strftime('%H:%M:%S', time.localtime(decision.finish_at))}"
              if math.isfinite(decision.finish_at) else "")
    what = "deadline plan" if round_number == 1 else f"deadline plan, round {round_number} (after the last finished)"
    estimate = decision.estimate_text() if decision.probe else decision.estimate_text(decision.admitted or decision.left)
    return (f"{what}: starting {len(decision.admitted)} of {units} Tune trial(s) ({len(admitted)} trial(s)){finish}; "
            f"leaving {len(decision.left)} that would not end before the deadline; estimate: {estimate}")


def nothing_fits(space: Space, plan: SweepPlan, out_dir: Path, deadline: deadlines.Deadline,
                 estimate_s: float | None = None) -> DeadlineReport | None:
    """Before Ray starts: the report of a run that starts nothing, when even as many slots as trials
    would admit none (the deadline is too near for the start-up, or every trial is longer than the
    time left); None when something may fit (Ray then starts and the rounds decide)."""
    first = plan_deadline_round(space, plan, out_dir, deadline, plan.pending, nodes=None, probe=True,
                                estimate_s=estimate_s, slots=max(1, len(plan.pending)))
    if first.admitted:
        return None
    print(deadline_plan_line(first.decision, first.admitted), flush=True)
    print("nothing fits before the deadline, even with every Tune trial on a slot of its own: Ray is not started",
          flush=True)
    return DeadlineReport(deadline, [], first.left, first.decision.estimate_text(first.decision.left))
