"""Issue 44, item 4: a sweep is planned apart from its launch. The planner (rpevit.sweep.launch_plan)
decides without Ray the Tune trials (fused groups, ladders, an interleaved timing run), what each
reserves, how many run at once and which a deadline round starts; the dry run estimates from the
same Tune trials the run would start."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rpevit.sweep import deadline as dl
from rpevit.sweep import dry_run
from rpevit.sweep.launch_plan import deadline_units, plan_deadline_round, plan_launch
from rpevit.sweep.plan import SweepPlan, prepare_trials
from rpevit.sweep.results import TRIALS_FILE, to_table, trials_schema, write_table_atomic
from rpevit.sweep.space import Resources, expand_space
from tests.test_sweep_deadline import row

ROOT = Path(__file__).resolve().parent.parent
TINY = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 96, "batch_size": 32, "epochs": 2}
LADDER = {**TINY, "lr_schedule": "wsd", "cooldown_fraction": 0.2, "warmup_epochs": 0.5}
BENCH = {"dataset": "cifar10", "image_size": 8, "patch_size": 4, "dim": 16, "depth": 1, "heads": 2,
         "bench_batch": 2, "bench_warmup": 1, "bench_iters": 2}
NODES = [{"CPU": 8.0}, {"CPU": 4.0}]

PLAN_WITHOUT_RAY = """
import json, sys, time
from pathlib import Path

import pytest
from rpevit.sweep import deadline as dl
from rpevit.sweep.launch_plan import plan_deadline_round, plan_launch
from rpevit.sweep.plan import SweepPlan
from rpevit.sweep.space import expand_space

out = Path(sys.argv[1])
tiny = {"dataset": "digits", "dim": 16, "depth": 1, "heads": 2, "train_subset": 96, "epochs": 2}
fused = expand_space({"name": "f", "fixed": tiny, "grid": {"pe": ["ape", "rope"]}, "seeds": [0, 1, 2],
                      "fuse": "seeds"}, source="f.yaml")
timing = expand_space({"name": "t", "task": "bench", "fixed": {"dataset": "cifar10", "image_size": 8, "patch_size": 4,
                       "dim": 16, "depth": 1, "heads": 2}, "grid": {"pe": ["ape", "rope", "none"]},
                       "timing": {"repeats": 2, "interleave": True}}, source="t.yaml")
nodes = [{"CPU": 4.0}]
units = {}
for space in (fused, timing):
    plan = SweepPlan(space.trials, list(range(len(space.trials))), space.resources)
    units[space.name] = [len(s.members) for s in plan_launch(space, plan, out / "trials", nodes).specs]
    planned = plan_deadline_round(space, plan, out, dl.Deadline(time.time() + 3600), plan.pending, nodes=nodes,
                                  probe=True, estimate_s=1.0)
    units[space.name + " admitted"] = planned.admitted
print(json.dumps({"units": units, "ray": sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))}))
"""


@pytest.mark.slow  # a subprocess: a fresh sys.modules
def test_planning_fused_groups_a_timing_run_and_a_deadline_imports_no_ray(tmp_path):
    done = subprocess.run([sys.executable, "-c", PLAN_WITHOUT_RAY, str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["ray"] == []
    assert result["units"] == {"f": [3, 3], "f admitted": [0, 1, 2, 3, 4, 5], "t": [3], "t admitted": [0, 1, 2]}


def fused_space(**extra):
    return expand_space({"name": "fused", "fixed": TINY, "grid": {"attention": ["softmax", "favor"]},
                         "seeds": [0, 1, 2], "fuse": "seeds", **extra}, source="fused.yaml")


def test_the_launch_holds_the_groups_their_bundle_and_the_slots_the_nodes_fit(tmp_path):
    space = fused_space(resources={"cpus_per_trial": 3})
    plan = SweepPlan(space.trials, [0, 1, 2, 4, 5], space.resources)  # #3 has a row: its group runs two seeds
    launch = plan_launch(space, plan, tmp_path / "trials", NODES)
    assert [[m.trial_key for m in s.members] for s in launch.specs] == [space.keys[:3], space.keys[4:]]
    assert all(s.fused and s.reserved_cpus == 3 for s in launch.specs)
    assert launch.bundle == {"CPU": 3.0} and launch.slots == 2  # 8 // 3 + 4 // 3 = 3 fit; 2 Tune trials
    assert plan_launch(space, plan, tmp_path, [{"CPU": 8.0}, {"CPU": 2.0}]).slots == 2
    assert plan_launch(space, plan, tmp_path, [{"CPU": 5.0}, {"CPU": 2.0}]).slots == 1  # 5 // 3 + 2 // 3
    assert launch.trial_indices(space) == [0, 1, 2, 4, 5]
    assert list(launch.trial_configs(space)) == [space.keys[i] for i in (0, 1, 2, 4, 5)]
    assert plan_launch(space, plan, tmp_path, [{"CPU": 1.0}]).slots == 1  # nothing fits: still one slot
    assert plan_launch(space, plan, tmp_path, None).slots == 2  # no nodes known: one slot per Tune trial


def test_a_timing_trial_reserves_the_largest_node_with_its_gpus(tmp_path):
    space = expand_space({"name": "t", "task": "bench", "fixed": BENCH, "grid": {"pe": ["ape", "rope"]},
                          "resources": {"cpus_per_trial": 1, "gpus_per_trial": 1}}, source="t.yaml")
    plan = SweepPlan(space.trials, [0, 1], space.resources)
    nodes = [{"CPU": 64.0}, {"CPU": 16.0, "GPU": 2.0}, {"CPU": 8.0, "GPU": 1.0}]
    launch = plan_launch(space, plan, tmp_path / "trials", nodes)
    assert launch.bundle == {"CPU": 16.0, "GPU": 1.0} and {s.reserved_cpus for s in launch.specs} == {16.0}
    assert launch.slots == 1 and [len(s.members) for s in launch.specs] == [1, 1]  # only the 16-CPU node holds one


def test_a_deadline_round_launches_exactly_the_groups_it_admits(tmp_path):
    space = fused_space()
    plan = SweepPlan(space.trials, list(range(6)), Resources(max_concurrent=1))
    # 100 s an epoch, 2 epochs: one group takes 205 s with its start; the deadline leaves room for one
    deadline = dl.Deadline(time.time() + dl.STARTUP_S + 300)
    planned = plan_deadline_round(space, plan, tmp_path, deadline, plan.pending, nodes=NODES, probe=True,
                                  estimate_s=100.0)
    assert planned.decision.admitted == [0] and planned.decision.left == [1]
    assert planned.admitted == [0, 1, 2] and planned.left == [3, 4, 5]
    assert [[m.trial_key for m in s.members] for s in planned.launch.specs] == [space.keys[:3]]
    assert planned.launch.slots == 1 and planned.launch.max_concurrent == 1


def ladder_space():
    return expand_space({"name": "ladder", "fixed": LADDER, "grid": {"attention": ["softmax", "favor"],
                                                                     "epochs": [5, 10]},
                         "branch": "epochs", "resources": {"max_concurrent": 2}}, source="ladder.yaml")


def test_the_dry_run_estimates_the_tune_trials_the_run_starts(tmp_path):
    """A budget ladder runs each trunk before the shorter trials (the Tune trials' order); the dry run's
    estimate follows that order: on two slots, the trunks (10 + 10 s), then each 5-epoch rung's 1-epoch
    cool-down from its trunk's checkpoint, end after 11 s of training, where space order (5, 10, 5, 10)
    would end after 20 s and rungs planned as whole runs after 15 s."""
    space = ladder_space()
    out = tmp_path / "ladder"
    out.mkdir()
    measured = row({**LADDER, "epochs": 10, "seed": 99}, 10.0, key=f"{7:016x}")  # 1 s an epoch, another trial
    write_table_atomic(to_table([measured], trials_schema("train")), out / TRIALS_FILE)
    plan = SweepPlan(prepare_trials(space, None), list(range(len(space.trials))), space.resources)
    launch = plan_launch(space, plan, out / "trials", None)
    assert [s.members[0].cfg["epochs"] for s in launch.specs] == [10, 10, 5, 5]
    line = dry_run.estimate_line(space, space.resources, str(tmp_path), None, resume=True, local=False)
    ends = dl.STARTUP_S + 2 * dl.PER_TRIAL_S + 11.0
    assert f"about {dl.span(ends)} for 4 of 4 Tune trial(s), 2 at a time" in line, line
    units = deadline_units(launch.specs)
    assert [(u.branch_of, u.branch_epoch) for u in units] == [(None, 0), (None, 0), (0, 4), (1, 4)]
    # --rungs-first: round 1 the trunks to epoch 4 (4 s each, side by side) then the cool-downs (1 s each); round 2,
    # a Tuner.fit of its own, the trunks from epoch 4 to 10 (6 s each, side by side)
    line = dry_run.estimate_line(space, space.resources, str(tmp_path), None, resume=True, local=False,
                                 rungs_first=True)
    one, two = dl.STARTUP_S + 2 * dl.PER_TRIAL_S + 4 + 1, dl.STARTUP_S + dl.PER_TRIAL_S + 6
    assert line.endswith(f"; --rungs-first: round 1 (4 Tune trial(s): every shorter trial, the trunks to their last "
                         f"branch) about {dl.span(one)}, then round 2 (2 trunk(s) to their own budget) about "
                         f"{dl.span(two)}"), line


def test_a_rung_is_planned_as_its_cool_down_only_once_its_trunk_has_passed_the_branch(tmp_path):
    """1 s an epoch; a 10-epoch trunk and its 5-epoch rung (branch after epoch 4, a 1-epoch cool-down). On one
    slot the rung starts after its trunk: 1 s. On two it would start beside its trunk, before the checkpoint,
    and train all 5 epochs: 5 s. With the trunk resumed past epoch 4 it trains on its own: 5 s. A deadline
    that only the cool-down fits admits it."""
    from rpevit import checkpoint
    from rpevit.config import TrialConfig

    estimator = dl.Estimator([row({**LADDER, "epochs": 10, "seed": 99}, 10.0, key=f"{7:016x}")], "train",
                             has_epochs=True)
    trunk_cfg, rung_cfg = {**LADDER, "epochs": 10}, {**LADDER, "epochs": 5}
    trunk = dl.Unit(((f"{1:016x}", trunk_cfg),))
    rung = dl.Unit(((f"{2:016x}", rung_cfg),), branch_of=0, branch_epoch=4)

    def plan(units: list, slots: int, at: float = float("inf")) -> dl.DeadlinePlan:
        return dl.plan_units(units, estimator, slots=slots, now=0.0, deadline=dl.Deadline(at),
                             checkpoint_root=tmp_path, probe=False)

    one, two = plan([trunk, rung], 1), plan([trunk, rung], 2)
    assert [e.seconds for e in one.estimates] == [10.0, 1.0]
    assert one.finish_at == dl.STARTUP_S + 2 * dl.PER_TRIAL_S + 11.0
    assert [e.seconds for e in two.estimates] == [10.0, 5.0]
    other = dl.Unit(((f"{3:016x}", {**trunk_cfg, "seed": 5}),))
    assert plan([trunk, other, dl.Unit(rung.members, branch_of=0, branch_epoch=4)], 2).estimates[2].seconds == 1.0
    tight = dl.STARTUP_S + 2 * dl.PER_TRIAL_S + 10.0 + 2.0  # the trunk and the cool-down fit, the whole rung not
    assert plan([trunk, rung], 1, at=tight).admitted == [0, 1]
    checkpoint.save(tmp_path / f"{1:016x}" / checkpoint.CHECKPOINT_NAME,  # the trunk resumes after epoch 6
                    {"model": {}, "optimizer": {}, "scheduler": {}, "rng": {}, "history": [], "epoch": 6,
                     "fingerprint": checkpoint.fingerprint(TrialConfig.from_dict(trunk_cfg))})
    assert [e.seconds for e in plan([trunk, rung], 1).estimates] == [4.0, 5.0]
